"""One summary per run: where it came from and what it measured (the outputs' Runs section)."""

from __future__ import annotations

from typing import Any

from harness.report.model import Report
from harness.rundir.paths import STATUS


def _same(values: list[Any]) -> Any:
    """The one value of a run's points, "mixed" when they differ, None when none has one."""
    vals = sorted({str(v) for v in values if v is not None})
    return None if not vals else vals[0] if len(vals) == 1 else "mixed"


def _kv_flags(points: list[Any]) -> str | None:
    """The points the rule kv_transport flagged (harness.validity.kv_transport), by flag."""
    flagged: dict[str, list[str]] = {}
    for p in points:
        if p.kv_handoff is not None and p.kv_handoff.flag is not None:
            flagged.setdefault(p.kv_handoff.flag, []).append(f"C={p.concurrency}" + (f" ISL {p.isl}" if p.isl else ""))
    return "; ".join(f"{flag} at {', '.join(where)}" for flag, where in sorted(flagged.items())) or None


def run_summaries(report: Report) -> list[dict[str, Any]]:
    out = []
    for run in report.runs:
        md = next((p.metadata for p in run.points if p.metadata), {})
        splits = [f"{p.prefill_gpus}+{p.decode_gpus}" if p.prefill_gpus is not None else None for p in run.points]
        state = (run.status or {}).get("state") if run.status else (f"no {STATUS}" if run.is_pdbench_run else None)
        out.append(
            {
                "run": run.label,
                "baseline": run.label == report.baseline,
                "path": report.rel(run.path),
                "source": _same([p.source for p in run.points]),
                "recipe": md.get("recipe"),
                "model": _same([p.model for p in run.points]),
                "precision": md.get("precision"),
                "connector": md.get("connector"),
                "gpus": _same(splits),
                "fingerprint": _same([p.fingerprint for p in run.points]),
                "state": state,
                "points": len(run.points),
                "kv_transport": _kv_flags(run.points),
            }
        )
    return out
