"""Predicted before it ran: a run directory's `prediction.json` (harness.rundir.prior_prediction,
written by `pdbench search` for a candidate it predicted) set beside what the run then measured,
point by point, with the error and whether the measurement fell inside the prediction's band."""

from __future__ import annotations

from harness.report.model import SectionTable
from harness.report.points import Note, Point, Run
from harness.rundir import RunDir
from harness.rundir.prior_prediction import PredictedPoint, PredictionError, read

TITLE = "Predicted before it ran (prediction.json) against measured"


def _measured(p: Point) -> tuple[float | None, float | None, float | None]:
    devices = (p.prefill_gpus or 0) + (p.decode_gpus or 0)
    per_device = p.total_token_throughput / devices if devices else None
    return p.ms.get("p90_ttft_ms"), p.ms.get("mean_tpot_ms"), per_device


def _cells(pred: float, meas: float | None) -> list[str]:
    if meas is None or meas == 0:
        return [f"{pred:.1f}", "-", "-"]
    return [f"{pred:.1f}", f"{meas:.1f}", f"{(pred - meas) / meas:+.0%}"]


def _row(run: Run, pp: PredictedPoint, p: Point) -> tuple[str, ...]:
    ttft, tpot, per_device = _measured(p)
    cells = _cells(pp.ttft_p90_ms, ttft) + _cells(pp.tpot_mean_ms, tpot) + _cells(pp.goodput_per_device, per_device)
    inside = "-"
    if per_device:
        inside = "yes" if abs(pp.goodput_per_device - per_device) <= pp.band * pp.goodput_per_device else "no"
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
            found = [p for p in run.points if (p.concurrency, p.isl, p.osl) == (pp.concurrency, pp.isl, pp.osl)]
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
        note="Each point as predicted before the run was launched (pdbench search, from the profile of a run it "
        "measured first; docs/search.md), beside what the run measured; err = (pred - meas) / meas; inside: the "
        "measured goodput per device within the prediction's band. Points the run did not reach are left out.",
        words=("inside",),
    )
