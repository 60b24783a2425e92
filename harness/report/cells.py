"""Cell text shared by the human-readable outputs (markdown, HTML)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness.report.model import Metric

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


def serving(row: Any) -> str:
    """The suffix that marks an aggregated baseline's row."""
    return " · aggregated" if row.get("serving") == "agg" else ""
