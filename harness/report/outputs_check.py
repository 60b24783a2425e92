"""The points' sentinel checks (a result's `sentinels` section, harness.rundir's SentinelSummary):
a cell's text (`3/4 (first divergence at token 17)`) and each run's match rate point by point in
the order the sweep ran them, with the largest fall."""

from __future__ import annotations

from harness.report.model import Drift, DriftStep
from harness.report.points import Point, Run, serving
from harness.rundir.sentinel_summary import SentinelSummary


def ratio(matched: int, compared: int, answered: int, sent: int) -> str:
    """matched/compared, the rate's own terms; where nothing was compared, why: `0/4 answered`
    (no answer came back) or `0/3 compared` (answered, but the reference did not answer them)."""
    if compared:
        return f"{matched}/{compared}"
    return f"0/{sent} answered" if answered == 0 else f"0/{answered} compared"


def outputs_text(s: SentinelSummary | None, rule: str | None) -> str | None:
    """matched/compared and what a reader must know beside it; None when nothing was checked
    (an older result, sentinels off)."""
    if s is None:
        return None if rule is None else rule.replace("_", " ")
    extra: list[str] = []
    if s.compared:
        positions = [d for d in s.first_divergence if d is not None]
        if s.exact < s.matched:
            extra.append(f"{s.exact} exact")
        if positions and s.exact < s.compared:
            # The writer gives a unit whenever a position is recorded; "position" only for a file without.
            extra.append(f"first divergence at {s.unit or 'position'} {min(positions)}")
        if s.compared < s.answered:
            extra.append(f"{s.answered - s.compared} not compared")
    if 0 < s.answered < s.sent:
        extra.append(f"{s.sent - s.answered} of {s.sent} unanswered")
    text = ratio(s.matched, s.compared, s.answered, s.sent)
    return text + (f" ({'; '.join(extra)})" if extra else "")


def _step(p: Point, s: SentinelSummary) -> DriftStep:
    return DriftStep(p.concurrency, p.isl, p.osl, s.matched, s.compared, s.answered, s.sent, s.match_rate)


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
