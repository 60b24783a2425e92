"""The points' sentinel checks: a cell's text (`3/4 (first divergence at token 17)`) and each
run's match rate point by point in the order the sweep ran them, with the largest fall."""

from __future__ import annotations

from harness.report.model import Drift, DriftStep
from harness.report.points import Point, Run, SentinelCheck, serving


def outputs_text(s: SentinelCheck | None, rule: str | None) -> str | None:
    """matched/answered and what a reader must know beside it; None when nothing was checked
    (an older result, sentinels off)."""
    if s is None:
        return None if rule is None else rule.replace("_", " ")
    if s.answered == 0:
        return f"0/{s.sent} answered"
    positions = [d for d in s.first_divergence if d is not None]
    extra: list[str] = []
    if s.exact < s.matched:
        extra.append(f"{s.exact} exact")
    if positions and s.exact < s.answered:
        extra.append(f"first divergence at token {min(positions)}")
    if s.answered < s.sent:
        extra.append(f"{s.sent - s.answered} of {s.sent} unanswered")
    return f"{s.matched}/{s.answered}" + (f" ({'; '.join(extra)})" if extra else "")


def _step(p: Point, s: SentinelCheck) -> DriftStep:
    return DriftStep(p.concurrency, p.isl, p.osl, s.matched, s.answered, s.sent, s.match_rate)


def _fall(steps: list[DriftStep]) -> tuple[DriftStep, DriftStep] | None:
    """The largest drop from the best rate so far to a later point's rate."""
    rated = [(s, s.match_rate) for s in steps if s.match_rate is not None]
    fall: tuple[DriftStep, DriftStep] | None = None
    drop = 0.0
    for i, (step, rate) in enumerate(rated):
        best, best_rate = max(rated[:i], key=lambda r: r[1], default=(step, rate))
        if best_rate - rate > drop:
            fall, drop = (best, step), best_rate - rate
    return fall


def drifts(runs: list[Run]) -> list[Drift]:
    """Per run and serving kind, the checked points in sweep order: by start time (the result's
    `benchmark_start_time_unix`, else its `date`), not by concurrency."""
    out: list[Drift] = []
    for run in runs:
        for kind in ("disagg", "agg"):
            checked = [p for p in run.points if p.sentinels is not None and serving(p) == kind]
            if not checked:
                continue
            checked.sort(key=lambda p: (p.started is None, p.started or 0.0, p.concurrency))
            steps = [_step(p, p.sentinels) for p in checked if p.sentinels is not None]
            out.append(Drift(run.label, kind, tuple(steps), _fall(steps)))
    return out
