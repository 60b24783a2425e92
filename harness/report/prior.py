"""Predicted before it ran: a run directory's `prediction.json` (harness.rundir.prior_prediction,
written by `pdbench submit` and by `pdbench search` for a candidate it predicted) set beside what
the run then measured, point by point, with the error and whether the measurement fell inside the
prediction's band (the check harness.rundir.prior_prediction defines)."""

from __future__ import annotations

from harness.report.model import SectionTable
from harness.report.points import Note, Point, Run, serving
from harness.rundir import RunDir
from harness.rundir.prior_prediction import PredictedPoint, PredictionError, read

TITLE = "Predicted before it ran (prediction.json) against measured"


def _measured(p: Point) -> tuple[float | None, float | None, float | None]:
    devices = (p.prefill_gpus or 0) + (p.decode_gpus or 0)
    per_device = p.total_token_throughput / devices if devices else None
    return p.ms.get("p90_ttft_ms"), p.ms.get("mean_tpot_ms"), per_device


def _row(run: Run, pp: PredictedPoint, p: Point) -> tuple[str, ...]:
    check = pp.check(*_measured(p))
    cells = []
    for key, err in check.error.items():
        meas = check.measured.get(key)
        cells += [
            f"{check.predicted[key]:.1f}",
            "-" if meas is None else f"{meas:.1f}",
            "-" if err is None else f"{err:+.0%}",
        ]
    inside = {None: "-", True: "yes", False: "no"}[check.inside]
    return (run.label, f"{pp.isl}/{pp.osl}", str(pp.concurrency), *cells, f"±{pp.band:.0%}", inside)


def prior_table(runs: list[Run], notes: list[Note]) -> SectionTable | None:
    rows: list[tuple[str, ...]] = []
    for run in runs:
        path = RunDir(run.path).prior_prediction
        if not path.is_file():
            continue
        try:
            prior = read(path)
        except PredictionError as e:
            notes.append(Note(path, f"not used: {e}"))
            continue
        for pp in prior.points:
            found = [p for p in run.points if pp.matches(p.concurrency, p.isl, p.osl, serving(p))]
            if found:  # the first measurement of the point (a repeat is not what was predicted)
                rows.append(_row(run, pp, min(found, key=lambda p: p.started or 0.0)))
    if not rows:
        return None
    headers = ["run", "isl/osl", "conc"]
    for label in ("TTFT p90 ms", "TPOT ms", "tok/s/device"):
        headers += [f"{label} pred", "meas", "err"]
    return SectionTable(
        title=TITLE,
        headers=(*headers, "band", "inside"),
        rows=tuple(rows),
        note="Each point as predicted before the run was launched (pdbench submit or search, from the profile of "
        "a run measured before; docs/predict.md), beside what the run measured; err = (pred - meas) / meas; inside: the "
        "measured goodput per device within the prediction's band. Points the run did not reach are left out.",
        words=("inside",),
    )
