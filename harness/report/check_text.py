"""The output checks in words, shared by markdown and HTML: a run's sentinel match point by point
in sweep order with its fall, and the accuracy table's cells."""

from __future__ import annotations

from harness.report.model import AccuracyRow, Comparison, Drift, DriftStep
from harness.report.outputs_check import ratio

ACCURACY_HEADERS = [
    "Run",
    "Eval",
    "Task (metric)",
    "Score ± stderr",
    "Threshold",
    "Passed",
    "Aggregated: score; diff [95 % CI]",
    "After - before [95 % CI]",
    "Samples",
]
DRIFT_NOTE = (
    "Sentinel prompts answered by the measured path, matched/compared against the reference "
    "path's answers (compared: answered by both paths), point by point in the order the sweep ran them."
)
ACCURACY_NOTE = (
    "Diff = this score - the other; its 95 % CI is diff ± 1.96·sqrt(stderr₁² + stderr₂²) (independent "
    "evals, normal approximation); an interval wholly below zero is a significant drop."
)


def _rate(r: float | None) -> str:
    return "n/a" if r is None else f"{100 * r:.0f}%"


def _step(s: DriftStep, shapes: bool) -> str:
    where = f"conc {s.conc}" + (f" @ {s.isl}/{s.osl}" if shapes else "")
    return f"{where}: {ratio(s.matched, s.compared, s.answered, s.sent)}"


def drift_steps(d: Drift) -> str:
    """`conc 1: 4/4 → conc 8: 4/4 → conc 4: 3/4`; the shape too when the run has several."""
    shapes = len({(s.isl, s.osl) for s in d.steps}) > 1
    return " → ".join(_step(s, shapes) for s in d.steps)


def drift_flag(d: Drift) -> str | None:
    """`falling: 100% at conc 1 to 75% at conc 4`, or None when no point fell below an earlier one."""
    if d.fall is None:
        return None
    a, b = d.fall
    return f"falling: {_rate(a.match_rate)} at conc {a.conc} to {_rate(b.match_rate)} at conc {b.conc}"


def drift_label(d: Drift) -> str:
    return d.run + (" · aggregated" if d.serving == "agg" else "")


def _score(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def _diff(c: Comparison) -> str:
    text = f"{c.diff:+.4f}"
    if c.low is None or c.high is None:
        return f"{text} [n/a: a stderr is unknown]"
    text += f" [{c.low:+.4f}, {c.high:+.4f}]"
    return text + (" significantly lower" if c.high < 0 else "")


def accuracy_cells(r: AccuracyRow) -> list[str]:
    score = _score(r.score) + (f" ± {r.stderr:.4f}" if r.stderr is not None else "")
    passed = {True: "yes", False: "NO", None: "–"}[r.passed]
    agg = r.versus_aggregated
    return [
        r.run,
        f"{r.phase} {r.when} the sweep, conc {r.concurrency}",
        f"{r.task} ({r.metric})",
        score,
        _score(r.threshold) if r.threshold is not None else "–",
        passed,
        f"{_score(agg.other)}; {_diff(agg)}" if agg else "–",
        _diff(r.versus_before) if r.versus_before else "–",
        str(r.samples) if r.samples is not None else "–",
    ]
