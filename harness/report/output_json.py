"""JSON: runs, rows (raw values in the units of their names), skipped files and notes."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from harness.report import cells
from harness.report.export import export_frame
from harness.report.model import Report
from harness.report.run_summary import run_summaries


def _clean(v: Any) -> Any:
    if cells.missing(v):
        return None
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else None
    if hasattr(v, "item"):  # numpy scalars
        return _clean(v.item())
    return v


def document(report: Report) -> dict[str, Any]:
    rows = [{k: _clean(v) for k, v in row.items()} for row in export_frame(report, 6).to_dict(orient="records")]
    doc: dict[str, Any] = {"baseline": report.baseline, "runs": run_summaries(report), "rows": rows}
    # The output checks only when a run has them, so older results' documents stay as they were.
    if report.drifts:
        doc["outputs_drift"] = [dataclasses.asdict(d) for d in report.drifts]
    if report.accuracy:
        doc["accuracy"] = [dataclasses.asdict(r) for r in report.accuracy]
    doc["skipped"] = [{"path": report.rel(s.path), "reason": s.reason} for s in report.skipped]
    doc["notes"] = list(report.notes)
    return doc


def render(report: Report) -> str:
    return json.dumps(document(report), indent=2) + "\n"
