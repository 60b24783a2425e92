#!/usr/bin/env python3
"""Sentinel overhead: a whole `pdbench bench` sweep with sentinels on against the same sweep off.

Every point of a sweep carries a few greedy sentinel requests (harness/bench/sentinels.py;
`benchmark.sentinels`: 2 % of the point's measured requests, at least 4). Before the sweep the
reference instance (the first prefill `--scrape` target, asked directly) answers all of them
whole; during a point sentinel k of m leaves once k/m of the measured requests finished, and
the point ends when its measured batch and its sentinels have. Issue 29 allows them at most 3 %
of the sweep's time.

Conditions (printed with the ratio): two `pdbench mock-engine` processes, a prefill (role
prefill) and a decode (role decode), both with TTFT and ITL as given (a whole request on one
of them takes TTFT + (OSL - 1) x ITL; decode's first token after a remote prefill takes one
ITL), counting tokens with the tiny model's tokenizer, behind the real `pdbench proxy`
(connector nixl, the default); `pdbench bench` sends to the proxy with `--scrape
prefill-0=prefill@PREFILL --scrape decode-0=decode@DECODE`, random prompts of exactly ISL
tokens, OSL tokens with ignore_eos, rate inf, the recipe's defaults for everything else
(measured requests per point 10 x C, 2 x C warm-ups, one load process). The same servers serve
every run.

The figure is the wall time of the `pdbench bench` process from its start to its exit (import,
tokenizer, preflight, the reference answers, every point's warm-ups, measured requests and
sentinels, the result files). The peer is the same command with `sentinels.enabled: false`
(a `--config` file); the two take turns for `--rounds` rounds (default 3), their order rotated
each round (`benchmarks.common.rotated`). Goal: with / without <= 1.03, the median of the
rounds' ratios (each round's two runs are adjacent, so the machine's load drift mostly cancels).

Printed beside: the floor, what the sentinels must cost even if perfectly overlapped (the
reference answers run beside the first point's warm-ups, one whole request at the least, and
the first measured batch waits for them; during the points their requests are the given share
of the measured ones), and where the time went in each run
with sentinels: the reference pass (pdbench's own log line), and per point how long after its
measured batch ended the point's last sentinel answered, with how many measured requests had
finished when that sentinel left.

    .venv/bin/python benchmarks/bench_sentinel_overhead.py [--rounds 3] [--isl 1024] [--osl 128] \\
        [--concurrency 8,32,64] [--ttft-ms 50] [--itl-ms 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.common import (  # noqa: E402
    conditions_text,
    free_port,
    load_text,
    rotated,
    spread,
    start_mock_engine,
)
from harness.config.benchmark import BenchmarkSettings  # noqa: E402

PY = sys.executable
GOAL = 1.03
WITH, WITHOUT = "sentinels on", "sentinels off"
CONFIGS: dict[str, dict[str, Any]] = {WITH: {}, WITHOUT: {"sentinels": {"enabled": False}}}
# pdbench bench's own report of the reference pass (harness/bench/sweep_sentinels.py).
REFERENCE_LINE = re.compile(r"sentinels: (\d+) of (\d+) reference answers from .* in ([0-9.]+) s")
POINT_SENTINELS_LINE = re.compile(r"C=(\d+)\S*: sentinels: ")
POINT_START_LINE = re.compile(r"C=(\d+)\S*: \d+ warmups, then ")
POINT_END_LINE = re.compile(r"C=(\d+)\S*: completed \d+, failed ")
SWEEP_TIMEOUT_S = 900.0


def recipe(concurrency: list[int], isl: int, osl: int) -> BenchmarkSettings:
    """The sweep's settings as pdbench bench takes them: the recipe's defaults, sentinels on."""
    return BenchmarkSettings(concurrency=concurrency, isl=isl, osl=osl)


def sentinels_per_point(settings: BenchmarkSettings) -> dict[int, int]:
    """Each point's sentinels (measured requests per point and the sentinel share from `settings`)."""
    return {c: settings.sentinels.per_point(settings.num_prompts_for(c)) for c in settings.concurrency}


def reference_pass(log: str) -> tuple[int, int, float] | None:
    """(answered, total, seconds) of the reference pass, from pdbench bench's log; None without one."""
    m = REFERENCE_LINE.search(log)
    return (int(m[1]), int(m[2]), float(m[3])) if m else None


def verdict(ratios: list[float]) -> bool:
    """The goal: the median of the rounds' with / without ratios at most GOAL."""
    return statistics.median(ratios) <= GOAL


@dataclass
class PointTail:
    """What one point's sentinels did to its end."""

    concurrency: int
    measured: int
    sentinels: int
    matched: int
    last_sent_after: int | None  # measured requests finished when the last sentinel left
    tail_s: float | None  # the point's sentinel line after its measured batch's end
    span_s: float  # the point's first log line (warm-ups) .. its last (completed)


@dataclass
class Sweep:
    name: str
    round: int
    wall_s: float
    load_before: str
    reference: tuple[int, int, float] | None = None
    points: list[PointTail] = field(default_factory=list)
    measured_s: float = 0.0  # sum of the points' measured batches (`duration`)
    before_points_s: float = 0.0  # process start .. the first point's first log line


def lines_at(stamped: list[tuple[float, str]], pattern: re.Pattern[str]) -> dict[int, float]:
    """When each point's line matching `pattern` arrived, by concurrency."""
    return {int(m[1]): at for at, line in stamped if (m := pattern.search(line))}


def run_sweep(name: str, rnd: int, args: argparse.Namespace, urls: dict[str, str], tok: str, work: Path) -> Sweep:
    """One `pdbench bench` process, timed from its start to its exit; its results checked."""
    out = work / f"round{rnd + 1}-{'on' if name == WITH else 'off'}"
    cfg = work / f"{out.name}.json"
    cfg.write_text(json.dumps(CONFIGS[name]))
    cmd = [
        PY, "-m", "harness", "bench", "--config", str(cfg), "--base-url", urls["proxy"], "--model", "tiny",
        "--tokenizer", tok, "--isl", str(args.isl), "--osl", str(args.osl), "--range-ratio", "1",
        "--concurrency", ",".join(map(str, args.concurrency)), "--results-dir", str(out),
        "--prefill-gpus", "1", "--decode-gpus", "1", "--progress", "plain",
        "--scrape", f"prefill-0=prefill@{urls['prefill']}", "--scrape", f"decode-0=decode@{urls['decode']}",
    ]  # fmt: skip
    stamped: list[tuple[float, str]] = []  # each output line with the wall clock it arrived at
    load_before = load_text()
    t0, started = time.perf_counter(), time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            stamped.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=SWEEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise SystemExit(f"{name}: pdbench bench ran past {SWEEP_TIMEOUT_S:g} s") from None
    wall = time.perf_counter() - t0
    reader.join(10)
    log = "\n".join(line for _, line in stamped)
    if rc != 0:
        raise SystemExit(f"{name}: pdbench bench exited {rc}:\n{log[-3000:]}")
    sweep = Sweep(name, rnd + 1, wall, load_before, reference_pass(log))
    starts, ends = lines_at(stamped, POINT_START_LINE), lines_at(stamped, POINT_END_LINE)
    if starts:
        sweep.before_points_s = min(starts.values()) - started
    settings = recipe(args.concurrency, args.isl, args.osl)
    expected = sentinels_per_point(settings) if name == WITH else dict.fromkeys(args.concurrency, 0)
    sentinel_lines = lines_at(stamped, POINT_SENTINELS_LINE)
    for c in args.concurrency:
        files = list(out.glob(f"concurrency_{c}_*.json"))
        if len(files) != 1:
            raise SystemExit(f"{name}: expected one result for C={c} in {out}, found {len(files)}")
        data = json.loads(files[0].read_text())
        n = settings.num_prompts_for(c)
        if data["completed"] != n or data["failed"]:
            raise SystemExit(f"{name}: C={c}: {data['completed']} of {n} completed, {data['failed']} failed")
        sweep.measured_s += float(data["duration"])
        section = data.get("sentinels") or {}
        sent, matched = int(section.get("sent", 0)), int(section.get("matched", 0))
        if sent != expected[c] or matched != sent:
            raise SystemExit(f"{name}: C={c}: {sent} sentinels sent, {matched} matched (expected {expected[c]} sent)")
        last_after = tail = None
        if sent:
            record = json.loads((out / section["record"]).read_text())
            last_after = max(int(s["sent_after_measured"]) for s in record["sentinels"])
            if c in sentinel_lines:
                tail = sentinel_lines[c] - float(data["benchmark_end_time_unix"])
        if c not in starts or c not in ends:
            raise SystemExit(f"{name}: C={c}: no start or end line in pdbench bench's log:\n{log[-3000:]}")
        sweep.points.append(PointTail(c, n, sent, matched, last_after, tail, ends[c] - starts[c]))
    if name == WITH and (sweep.reference is None or sweep.reference[0] != sweep.reference[1]):
        raise SystemExit(f"{name}: the reference pass did not answer every sentinel: {sweep.reference}")
    return sweep


def wait_proxy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> None:
    """Until the proxy's /health says both instances are ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the proxy exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if json.loads(r.read()).get("status") == "ok":
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise SystemExit(f"the proxy was not ready in {timeout_s:g} s; see {log}")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def report(sweeps: list[Sweep], args: argparse.Namespace) -> bool:
    on = [s for s in sweeps if s.name == WITH]
    off = [s for s in sweeps if s.name == WITHOUT]
    ratios = [a.wall_s / b.wall_s for a, b in zip(on, off, strict=True)]
    settings = recipe(args.concurrency, args.isl, args.osl)
    per_point = sentinels_per_point(settings)
    measured = sum(settings.num_prompts_for(c) for c in args.concurrency)
    warmups = sum(settings.num_warmups_for(c) for c in args.concurrency)
    extra = sum(per_point.values())
    request_s = (args.ttft_ms + (args.osl - 1) * args.itl_ms) / 1000  # one whole request on one instance
    off_med = statistics.median(s.wall_s for s in off)
    print()
    print(
        f"conditions: pdbench proxy (nixl flow) in front of two pdbench mock-engine processes (prefill, decode), "
        f"TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms (a whole request {request_s:.2f} s), ISL {args.isl}, "
        f"OSL {args.osl}, ignore_eos, rate inf, concurrency {','.join(map(str, args.concurrency))}, "
        f"{measured} measured requests + {warmups} warm-ups in the sweep (10 x C and 2 x C per point), "
        f"sentinels per point {', '.join(f'C={c}: {m}' for c, m in per_point.items())} "
        f"({extra} in all, {100 * extra / measured:.1f} % of the measured requests), answered again by the "
        f"reference beside the first warm-ups; figure: wall time of the pdbench bench process, start to exit; "
        f"{args.rounds} rounds, order rotated; {os.cpu_count()} CPUs"
    )
    for s in sweeps:
        ref = f", reference pass {s.reference[2]:.1f} s" if s.reference else ""
        print(f"  round {s.round} {s.name}: {s.wall_s:.1f} s (measured {s.measured_s:.1f} s{ref}); {s.load_before}")
    for name, runs in ((WITHOUT, off), (WITH, on)):
        print(f"{name:13s}: sweep wall time {spread([s.wall_s for s in runs], '.1f', ' s')}")
    print(
        f"measured batches, with - without: "
        f"{spread([a.measured_s - b.measured_s for a, b in zip(on, off, strict=True)], '+.2f', ' s')}"
    )
    pairs = list(zip(on, off, strict=True))
    before = [a.before_points_s - b.before_points_s for a, b in pairs]
    spans = [sum(p.span_s for p in a.points) - sum(p.span_s for p in b.points) for a, b in pairs]
    rest = [a.wall_s - b.wall_s - x - y for (a, b), x, y in zip(pairs, before, spans, strict=True)]
    print(
        f"with - without, round by round: before the first point {spread(before, '+.2f', ' s')}; "
        f"the points (first .. last line of each) {spread(spans, '+.2f', ' s')}; "
        f"the rest (between points, after the last) {spread(rest, '+.2f', ' s')}"
    )
    print("where the sentinels' time went (runs with sentinels; medians over rounds):")
    refs = [s.reference[2] for s in on if s.reference]
    share = 100 * statistics.median(refs) / off_med
    print(
        f"  reference pass (beside the first point's warm-ups): {spread(refs, '.2f', ' s')} = {share:.1f} % "
        "of the sweep without"
    )
    for i, c in enumerate(args.concurrency):
        tails = [t for s in on if (t := s.points[i].tail_s) is not None]
        spans = [a.points[i].span_s - b.points[i].span_s for a, b in zip(on, off, strict=True)]
        after = [a for s in on if (a := s.points[i].last_sent_after) is not None]
        m, n = per_point[c], on[0].points[i].measured
        due = (m - 1) * max(0, n - c) / m  # harness.bench.sentinels spreads them over the first n - C
        print(
            f"  C={c}: {m} sentinels, the last due after {due:.1f} of {n} measured, left after "
            f"{', '.join(map(str, after))}; the point's end (sentinels answered, /metrics scraped) after its "
            f"measured batch's: {spread(tails, '.2f', ' s') if tails else '-'}; the point's span, with - without: "
            f"{spread(spans, '+.2f', ' s')}"
        )
    print(
        f"floor (perfect overlap): the reference pass is at least one whole request, {request_s:.2f} s = "
        f"{100 * request_s / off_med:.1f} % of the sweep without, 0 where the first warm-ups last longer; the points' sentinels are {extra} requests "
        f"beside {measured} measured + {warmups} warm-ups ({100 * extra / (measured + warmups):.1f} % of the "
        f"requests: their cost where the servers' throughput is the limit; here, with a mock that does not slow "
        f"down under load, perfectly overlapped they cost 0)"
    )
    print(f"each round's with / without: {', '.join(f'{r:.4f}' for r in ratios)}")
    med = statistics.median(ratios)
    ok = verdict(ratios)
    print(
        f"with / without sentinels, median of {len(ratios)} rounds = {med:.4f} ({spread(ratios, '.4f')}; "
        f"ratio of medians {statistics.median(s.wall_s for s in on) / off_med:.4f}); goal <= {GOAL:g}: "
        f"{'PASS' if ok else 'FAIL'}; {conditions_text()}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"ratios": ratios, "sweeps": [asdict(s) for s in sweeps]}, indent=1))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--isl", type=int, default=1024)
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32, 64])
    ap.add_argument("--ttft-ms", type=float, default=50.0, help="both mock engines' TTFT")
    ap.add_argument("--itl-ms", type=float, default=10.0, help="both mock engines' ITL")
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")

    work = Path(tempfile.mkdtemp(prefix="pdbench-sentinel-overhead-"))
    procs: list[subprocess.Popen[bytes]] = []
    sweeps: list[Sweep] = []
    try:
        from harness import tiny_model

        tok = str(tiny_model.build(work / "tiny"))
        urls: dict[str, str] = {}
        timing = ["--ttft-ms", f"{args.ttft_ms:g}", "--itl-ms", f"{args.itl_ms:g}"]
        for role in ("prefill", "decode"):
            port = free_port()
            argv = ["--role", role, "--model", "tiny", "--tokenizer", tok, *timing]
            procs.append(start_mock_engine(port, work / f"{role}.log", *argv, timeout_s=120))
            urls[role] = f"http://127.0.0.1:{port}"
        port = free_port()
        urls["proxy"] = f"http://127.0.0.1:{port}"
        proxy_log = work / "proxy.log"
        with proxy_log.open("wb") as log:
            argv = [PY, "-m", "harness", "proxy", "--host", "127.0.0.1", "--port", str(port)]
            argv += ["--prefill", urls["prefill"], "--decode", urls["decode"]]
            procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        wait_proxy(urls["proxy"], procs[-1], proxy_log)
        for r in range(args.rounds):
            for name in rotated([WITHOUT, WITH], r):
                s = run_sweep(name, r, args, urls, tok, work)
                sweeps.append(s)
                ref = f", reference pass {s.reference[2]:.1f} s" if s.reference else ""
                print(f"round {r + 1}: {name:13s} {s.wall_s:6.1f} s{ref}; {s.load_before}", flush=True)
    finally:
        stop(procs)
        shutil.rmtree(work, ignore_errors=True)
    return 0 if report(sweeps, args) else 1


if __name__ == "__main__":
    sys.exit(main())
