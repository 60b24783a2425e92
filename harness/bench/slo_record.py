"""An SLO search's judgement of each point and its record, slo_search.json (harness.rundir.paths
SLO_SEARCH), rewritten atomically after every step so that a job stopped at any moment leaves
what it found (`done` false until the search ended normally)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import atomic
from harness.bench.slo_ladder import Bracket
from harness.config.slo import violated_metrics, violations
from harness.interval import t_interval


@dataclass(frozen=True)
class Verdict:
    meets: bool
    violations: list[str]


def devices(metadata: Mapping[str, Any]) -> int | None:
    """The point's devices: prefill_gpus + decode_gpus (an aggregated point: gpus); None when unknown."""
    p, d = metadata.get("prefill_gpus"), metadata.get("decode_gpus")
    if isinstance(p, int) and isinstance(d, int):
        return p + d
    g = metadata.get("gpus")
    return g if isinstance(g, int) else None


def goodput_per_device(result: Mapping[str, Any]) -> float | None:
    """The point's total_token_throughput over its devices; None when they are unknown."""
    n = devices(result.get("metadata") or {})
    tput = result.get("total_token_throughput")
    if not n or not isinstance(tput, int | float):
        return None
    return float(tput) / n


def judge(slos: Mapping[str, Mapping[str, float]], result: Mapping[str, Any] | None) -> dict[str, Verdict]:
    """Each SLO's verdict of a point: it meets when it meets every bound, its verdict is not
    invalid and no request failed. A point without a result meets none."""
    if result is None:
        return {name: Verdict(False, ["no result"]) for name in slos}
    common = []
    metadata = result.get("metadata") or {}
    if metadata.get("valid") is False:
        reasons = (metadata.get("validity") or {}).get("reasons") or []
        common.append("invalid: " + ("; ".join(map(str, reasons)) or "judged invalid"))
    if failed := result.get("failed"):
        common.append(f"{failed} request(s) failed")
    if stop := result.get("stop_reason"):
        common.append(f"cut short: {stop}")  # not measured to its end: no evidence that it meets
    out = {}
    for name, bounds in slos.items():
        words = violations(bounds, result) + common
        out[name] = Verdict(not words, words)
    return out


class SearchRecord:
    """slo_search.json: the ladder, the SLOs, every step with its verdicts, the outcome per SLO."""

    def __init__(self, path: Path, ladder: Sequence[int], slos: Mapping[str, Mapping[str, float]], start: int):
        self.path = path
        self.slos = {name: dict(bounds) for name, bounds in slos.items()}
        self.doc: dict[str, Any] = {
            "ladder": list(ladder),
            "slos": self.slos,
            "start": start,
            "steps": [],
            "best": {name: None for name in slos},
            "first_failing": {name: None for name in slos},
            "violated": {name: [] for name in slos},
            "repeats": {},
            "done": False,
        }
        self.results: dict[int, Mapping[str, Any] | None] = {}  # first measurements, for `violated`

    def step(
        self,
        concurrency: int,
        repeat: int,
        why: str,
        file: str | None,
        result: Mapping[str, Any] | None,
        verdicts: Mapping[str, Verdict],
    ) -> None:
        if repeat == 0:
            self.results[concurrency] = result
        self.doc["steps"].append(
            {
                "concurrency": concurrency,
                "repeat": repeat,
                "file": file,
                "why": why,
                "meets": {n: v.meets for n, v in verdicts.items()},
                "violations": {n: v.violations for n, v in verdicts.items()},
                "devices": devices((result or {}).get("metadata") or {}),
                "goodput_per_device": goodput_per_device(result) if result is not None else None,
            }
        )
        self.write()

    def brackets(self, brackets: Mapping[str, Bracket]) -> None:
        """Each SLO's best and first failing value, and the metrics the first failing point exceeds."""
        for name, b in brackets.items():
            self.doc["best"][name] = b.best
            self.doc["first_failing"][name] = b.first_failing
            failing = self.results.get(b.first_failing) if b.first_failing is not None else None
            self.doc["violated"][name] = sorted(violated_metrics(self.slos[name], failing)) if failing else []
        self.write()

    def repeats(self, concurrency: int, samples: Sequence[float], confidence: float, stopped: str | None) -> None:
        """A repeated point's goodput-per-device samples (the first measurement's included) and
        their t-interval; `stopped` is why the repeats ended (tight | max), None while they go on."""
        iv = t_interval(samples, confidence).to_json() if samples else {"mean": 0.0, "half_width": None}
        self.doc["repeats"][str(concurrency)] = {
            "samples": list(samples),
            "mean": iv["mean"],
            "half_width": iv["half_width"],  # null below two samples (strict JSON: no infinity)
            "relative": iv.get("relative"),
            "stopped": stopped,
        }
        self.write()

    def done(self) -> None:
        self.doc["done"] = True
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)  # as write_result: the first file of a new folder
        atomic.write_json(self.path, self.doc, indent=2)
