#!/usr/bin/env python3
"""Prometheus text parsing: pdbench's own parser (harness.validity.series.Scrape.parse) against
prometheus_client's (prometheus_client.parser.text_string_to_metric_families).

Why it matters: during a point's measured window the validity probe parses every server's scrape
on the client's event loop (harness.bench.validity_probe: every 2 s, one parse per server for the
gauge peaks and two per prefill or decode server for the early verdict, 7 for a 1P1D job with its
proxy), so a parse's time is time the loop does not read responses: TTFT and ITL include it.

Two scrapes: a real one (a tiny model's decode, tests/fixtures/metrics, ~9 KB) and a vLLM-shaped
large one (that scrape plus 8 engines x 12 histograms of 32 buckets, ~300 KB). Both parsers must
read the same series from each (checked); then each parses each scrape ROUNDS times, in turn,
their order rotated each round.

    .venv/bin/python benchmarks/bench_prom_parse.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import conditions_text, rotated, spread  # noqa: E402
from harness.validity.series import Scrape  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "metrics" / "nixl-1p1d" / "decode.after.prom"
Sample = tuple[str, tuple[tuple[str, str], ...], float]


def large(base: str, engines: int = 8, families: int = 12, buckets: int = 32) -> str:
    lines = []
    for e in range(engines):
        for f in range(families):
            name = f"vllm:h{f}_seconds"
            labels = f'engine="{e}",model_name="deepseek-ai/DeepSeek-R1"'
            lines += [f"# HELP {name} A histogram.", f"# TYPE {name} histogram"]
            for b in range(buckets - 1):
                lines.append(f'{name}_bucket{{{labels},le="{0.001 * 2**b}"}} {13.0 * b}')
            lines.append(f'{name}_bucket{{{labels},le="+Inf"}} 999.0')
            lines += [f"{name}_count{{{labels}}} 999.0", f"{name}_sum{{{labels}}} 12.5"]
    return base + "\n".join(lines) + "\n"


def ours(text: str) -> list[Sample]:
    return [(s.name, s.labels, s.value) for s in Scrape.parse(text).series]


def library(text: str) -> list[Sample]:
    return [
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    base = Path(FIXTURE).read_text()
    parsers: dict[str, Callable[[str], list[Sample]]] = {"pdbench": ours, "prometheus_client": library}
    print(f"conditions: {conditions_text()}")
    for label, text in (("real, tiny model", base), ("vLLM-shaped, 8 engines", large(base))):
        if sorted(ours(text)) != sorted(library(text)):
            print(f"{label}: the parsers read different series", file=sys.stderr)
            return 1
        times: dict[str, list[float]] = {name: [] for name in parsers}
        for r in range(args.rounds):
            for name in rotated(list(parsers), r):
                t0 = time.perf_counter()
                parsers[name](text)
                times[name].append((time.perf_counter() - t0) * 1e3)
        n = len(ours(text))
        print(f"{label}: {len(text):,} bytes, {n:,} samples")
        for name, ms in times.items():
            print(f"  {name:18s} {spread(ms, '.2f', ' ms')}")
        ratios = [b / a for a, b in zip(times["pdbench"], times["prometheus_client"], strict=True)]
        print(f"  prometheus_client / pdbench: {spread(ratios, '.1f', 'x')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
