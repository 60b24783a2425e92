"""pdbench's verdict of one eval, read from lm-eval's results file; its format is
harness.rundir.accuracy_summary (what status and `pdbench report` read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.atomic import write_json
from harness.config.accuracy import AccuracyTask
from harness.rundir.accuracy_summary import AccuracySummary, TaskScore


def verdict(score: float | None, threshold: float | None) -> bool | None:
    """None without a threshold; a missing score fails a threshold."""
    if threshold is None:
        return None
    return score is not None and score >= threshold


def stderr_key(metric: str) -> str:
    """lm-eval's stderr key of a metric key: 'exact_match,strict-match' -> 'exact_match_stderr,strict-match'."""
    name, sep, filt = metric.partition(",")
    return f"{name}_stderr{sep}{filt}"


def _number(v: Any) -> float | None:
    # lm-eval writes "N/A" for a stderr it could not compute (one sample).
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def score_task(task: AccuracyTask, results: dict[str, Any] | None) -> TaskScore:
    """One task's score from lm-eval's results JSON (None: it wrote none)."""
    row = ((results or {}).get("results") or {}).get(task.name) or {}
    score = _number(row.get(task.metric))
    samples = ((results or {}).get("n-samples") or {}).get(task.name, {}).get("effective")
    return TaskScore(
        task=task.name,
        metric=task.metric,
        score=score,
        stderr=_number(row.get(stderr_key(task.metric))),
        threshold=task.threshold,
        passed=verdict(score, task.threshold),
        samples=samples if isinstance(samples, int) else None,
    )


def failures(summary: AccuracySummary) -> list[str]:
    """Why the eval fails the job, one line per task (or the error)."""
    out = [
        f"accuracy {summary.phase} {summary.when}: task {t.task} scored {_fmt(t.score)} ({t.metric}), "
        f"under its threshold {t.threshold}"
        for t in summary.tasks
        if t.passed is False
    ]
    if summary.error is not None:
        out.append(f"accuracy {summary.phase} {summary.when}: {summary.error}")
    return out


def write(summary: AccuracySummary, path: Path) -> Path:
    """The summary as JSON, never over an earlier eval's."""
    return write_json(path, summary.model_dump(mode="json"), indent=2, replace=False)


def _fmt(score: float | None) -> str:
    return "nothing" if score is None else f"{score:.4f}"
