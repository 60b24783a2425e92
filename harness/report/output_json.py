"""JSON: runs, rows (raw values in the units of their names), skipped files and notes."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from harness.report import cells
from harness.report.export import export_frame
from harness.report.model import Report, ShapeDecision
from harness.report.run_summary import run_summaries


def _clean(v: Any) -> Any:
    if cells.missing(v):
        return None
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else None
    if hasattr(v, "item"):  # numpy scalars
        return _clean(v.item())
    return v


def _decision(d: ShapeDecision) -> dict[str, Any]:
    """What markdown and HTML say of one shape: the fronts, the ratios, the SLO's best points."""
    best = {k: None if row is None else {c: _clean(v) for c, v in row.items()} for k, row in d.best.items()}
    return _clean_tree(
        {
            "isl": d.isl,
            "osl": d.osl,
            "fronts": {k: [dataclasses.asdict(p) for p in f] for k, f in d.fronts.items()},
            "ttft_p99_fronts": {k: [dataclasses.asdict(p) for p in f] for k, f in d.ttft_fronts.items()},
            "at_interactivity": [
                {"tok_s_user": x, "disagg_tput_per_gpu": a, "agg_tput_per_gpu": b, "ratio": r}
                for x, a, b, r in d.at_interactivity
            ],
            "at_concurrency": [
                {"conc": c, "disagg_tput_per_gpu": a, "agg_tput_per_gpu": b, "ratio": r}
                for c, a, b, r in d.at_concurrency
            ],
            "best": best,
        }
    )


def _clean_tree(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _clean_tree(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean_tree(x) for x in v]
    return _clean(v)


def document(report: Report) -> dict[str, Any]:
    rows = [{k: _clean(v) for k, v in row.items()} for row in export_frame(report, 6).to_dict(orient="records")]
    doc: dict[str, Any] = {"baseline": report.baseline, "runs": run_summaries(report), "rows": rows}
    # The output checks only when a run has them, so older results' documents stay as they were.
    if report.drifts:
        doc["outputs_drift"] = [dataclasses.asdict(d) for d in report.drifts]
    if report.accuracy:
        doc["accuracy"] = [dataclasses.asdict(r) for r in report.accuracy]
    if report.sections:
        doc["sections"] = [dataclasses.asdict(t) for t in report.sections]
    if report.slo:
        doc["slo"] = dict(report.slo)
    if report.decisions:
        doc["decisions"] = [_decision(d) for d in report.decisions]
    doc["skipped"] = [{"path": report.rel(s.path), "reason": s.reason} for s in report.skipped]
    doc["notes"] = list(report.notes)
    return doc


def render(report: Report) -> str:
    return json.dumps(document(report), indent=2) + "\n"
