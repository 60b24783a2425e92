"""Each run's accuracy evals as rows: every task's score beside its threshold, a disaggregated
score against the aggregated baseline's, an after-sweep score against the before-sweep one, and
notes for evals that failed or did not finish."""

from __future__ import annotations

import math

from harness.report.model import AccuracyRow, Comparison
from harness.report.points import Run
from harness.rundir.accuracy_summary import AccuracySummary, TaskScore

Z95 = 1.96  # two-sided 95 % quantile of the normal distribution


def compare(score: float, stderr: float | None, other: float, other_stderr: float | None) -> Comparison:
    """score - other with a 95 % confidence interval. The two evals are independent samples, so
    the difference's standard error is sqrt(s1^2 + s2^2) and the interval diff +- 1.96 * that
    (normal approximation, as lm-eval's own stderr is)."""
    diff = score - other
    if stderr is None or other_stderr is None:
        return Comparison(other, other_stderr, diff, None, None)
    half = Z95 * math.sqrt(stderr**2 + other_stderr**2)
    return Comparison(other, other_stderr, diff, diff - half, diff + half)


def _same_task(summary: AccuracySummary | None, task: TaskScore) -> TaskScore | None:
    if summary is None:
        return None
    return next((t for t in summary.tasks if t.task == task.task and t.metric == task.metric), None)


def _versus(task: TaskScore, other: TaskScore | None) -> Comparison | None:
    if other is None or task.score is None or other.score is None:
        return None
    return compare(task.score, task.stderr, other.score, other.stderr)


def _find(run: Run, phase: str, when: str) -> AccuracySummary | None:
    return next((s for s in run.accuracy if s.phase == phase and s.when == when), None)


def accuracy_rows(runs: list[Run]) -> tuple[list[AccuracyRow], list[str]]:
    """Rows per run: disaggregated before aggregated, before the sweep before after it."""
    rows: list[AccuracyRow] = []
    notes: list[str] = []
    for run in runs:
        for s in sorted(run.accuracy, key=lambda s: (s.phase != "disagg", s.when != "before")):
            where = f"{s.phase} {s.when} the sweep"
            if s.error:
                notes.append(f"{run.label}: accuracy eval ({where}) did not finish: {s.error}")
            # The baseline of the same moment, else the one there is.
            agg = _find(run, "aggregated", s.when) or _find(
                run, "aggregated", "after" if s.when == "before" else "before"
            )
            before = _find(run, s.phase, "before") if s.when == "after" else None
            for t in s.tasks:
                if t.passed is False:
                    notes.append(
                        f"{run.label}: accuracy BELOW THRESHOLD ({where}): {t.task} {t.metric} "
                        f"{t.score if t.score is not None else 'n/a'} < {t.threshold}"
                    )
                rows.append(
                    AccuracyRow(
                        run=run.label,
                        phase=s.phase,
                        when=s.when,
                        concurrency=s.concurrency,
                        task=t.task,
                        metric=t.metric,
                        score=t.score,
                        stderr=t.stderr,
                        threshold=t.threshold,
                        passed=t.passed,
                        samples=t.samples,
                        versus_aggregated=_versus(t, _same_task(agg, t)) if s.phase == "disagg" else None,
                        versus_before=_versus(t, _same_task(before, t)),
                    )
                )
    return rows, notes
