"""Prometheus scrapes of vLLM servers, read by metric-name pattern.

Metric names differ between vLLM versions and connectors (`vllm:external_prefix_cache_hits_total`
or `vllm:prompt_tokens_cached_by_source_total{source="p2p"}`; `vllm:nixl_*`, MoRI-IO's, the
bundled connector's), so every lookup is by regular expression over the family name and
reports which series it used. A lookup that matches nothing returns None, never 0: the
caller then marks its rule "not checked".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The one Prometheus text parser of pdbench (benchmarks/devpair.py uses it too). Not
# prometheus_client.parser: the validity probe parses every server's scrape on the client's event
# loop during the measured window (7 parses every 2 s for a 1P1D job and its proxy), where a parse's
# time lands in TTFT and ITL, and the library's is several times slower. benchmarks/bench_prom_parse.py,
# 2026-11-29 on this 2-core machine at load average 12-14, 15 rounds interleaved, median (min):
# a tiny model's 9 KB scrape 0.36 ms (0.32) here against 10.3 ms (1.7); a vLLM-shaped 300 KB scrape
# of 8 engines' histograms 67 ms (39) against 247 ms (204). Both read the same series from each.
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Series:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass
class Scrape:
    series: list[Series] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        out = []
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = _SAMPLE.match(line)
            if not m:
                continue
            try:
                value = float(m["value"])
            except ValueError:
                continue
            labels = tuple(sorted(_LABEL.findall(m["labels"] or "")))
            out.append(Series(m["name"], labels, value))
        return cls(out)

    def find(self, pattern: str, **labels: str) -> list[Series]:
        rx = re.compile(pattern)
        return [s for s in self.series if rx.fullmatch(s.name) and all(s.label(k) == v for k, v in labels.items())]

    def total(self, pattern: str, **labels: str) -> tuple[float, list[str]] | None:
        """Sum of every matching series (all engines), with the names used; None if none match."""
        found = self.find(pattern, **labels)
        if not found:
            return None
        return sum(s.value for s in found), sorted({s.name for s in found})


def delta(before: Scrape, after: Scrape, pattern: str, **labels: str) -> tuple[float, list[str]] | None:
    """after - before for a counter family; None when the server does not export it."""
    a = after.total(pattern, **labels)
    if a is None:
        return None
    b = before.total(pattern, **labels)
    return a[0] - (b[0] if b else 0.0), a[1]
