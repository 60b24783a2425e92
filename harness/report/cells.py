"""Cell text shared by the human-readable outputs (markdown, HTML)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness.report.table import Metric, Report

NA = "n/a"


def missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def value(m: Metric, v: Any) -> str:
    if missing(v):
        return NA
    if m.kind == "count":
        return f"{int(v):,d}"
    return f"{float(v):,.1f}"


def delta(m: Metric, d: Any, pct: Any) -> str | None:
    """'+12.3, +4.5%' (signed: candidate - baseline), or None when there is nothing to compare."""
    if missing(d):
        return None
    text = f"{int(d):+,d}" if m.kind == "count" else f"{float(d):+,.1f}"
    return f"{text}, {float(pct):+.1f}%" if not missing(pct) else text


def direction(m: Metric, d: Any) -> int:
    """+1 better, -1 worse, 0 same or unknown."""
    if missing(d) or d == 0:
        return 0
    return m.better if d > 0 else -m.better


def gpus(row: Any) -> str:
    p, d = row["prefill_gpus"], row["decode_gpus"]
    return NA if missing(p) or missing(d) else f"{p}+{d}"


def integer(v: Any) -> str:
    return NA if missing(v) else str(int(v))


def run_summaries(report: Report) -> list[dict[str, Any]]:
    """One line per run: where it came from and what it measured."""
    out = []
    for run in report.runs:
        md = next((p.metadata for p in run.points if p.metadata), {})

        def same(values: list[Any]) -> Any:
            vals = sorted({str(v) for v in values if v is not None})
            return None if not vals else vals[0] if len(vals) == 1 else "mixed"

        splits = [f"{p.prefill_gpus}+{p.decode_gpus}" if p.prefill_gpus is not None else None for p in run.points]
        state = (run.status or {}).get("state") if run.status else ("no status.json" if run.is_pdbench_run else None)
        out.append(
            {
                "run": run.label,
                "baseline": run.label == report.baseline,
                "path": report.rel(run.path),
                "source": same([p.source for p in run.points]),
                "recipe": md.get("recipe"),
                "model": same([p.model for p in run.points]),
                "precision": md.get("precision"),
                "connector": md.get("connector"),
                "gpus": same(splits),
                "fingerprint": same([p.fingerprint for p in run.points]),
                "state": state,
                "points": len(run.points),
            }
        )
    return out


def serving(row: Any) -> str:
    """The suffix that marks an aggregated baseline's row."""
    return " · aggregated" if row.get("serving") == "agg" else ""
