"""The report's predicted-against-measured section (`pdbench report --predict`): every point of a
run predicted from a profile fitted on the run's other points (harness.predict.holdout), beside
what was measured and the error, and per run the median absolute error of each figure."""

from __future__ import annotations

from pathlib import Path

from harness.predict.holdout import METRICS, Checked, leave_one_out, median_abs_error
from harness.predict.limits import LimitsError, kv_polled, of_run
from harness.predict.observe import ObservationError, observe
from harness.report.model import SectionTable
from harness.report.points import Note, Run

TITLE = "Predicted against measured (each point from the run's other points)"
LABELS = {"p90_ttft_ms": "TTFT p90 ms", "mean_tpot_ms": "TPOT ms", "output_tps_per_gpu": "tok/s/GPU"}


def _cells(c: Checked, metric: str) -> tuple[str, str, str]:
    measured, predicted = c.pair(metric)
    err = c.error(metric)
    return (
        f"{predicted:.1f}" if predicted is not None else "-",
        f"{measured:.1f}",
        f"{err:+.0%}" if err is not None else "-",
    )


def predicted_table(runs: list[Run], notes: list[Note]) -> SectionTable | None:
    rows: list[tuple[str, ...]] = []
    findings: list[str] = []
    for run in runs:
        try:
            obs = [observe(p) for p in run.points]
            engines = of_run(Path(run.path))
            polled = kv_polled(Path(run.path))
        except (ObservationError, LimitsError) as e:
            notes.append(Note(run.path, f"no prediction: {e}"))
            continue
        if not engines:
            notes.append(Note(run.path, "no recipe.lock.yaml: predictions assume vLLM's default engine limits"))
        checked = leave_one_out(obs, Path(run.path), engines, polled)
        for c in checked:
            o = c.observed
            cells = [x for m in METRICS for x in _cells(c, m)]
            why = c.why_not or "; ".join(c.predicted.extrapolating if c.predicted else []) or ""
            rows.append((run.label, o.phase, f"{o.isl}/{o.osl}", str(o.concurrency), *cells, why))
        maes = {m: median_abs_error(checked, m) for m in METRICS}
        said = ", ".join(f"{LABELS[m]} {v:.0%}" for m, v in maes.items() if v is not None)
        if said:
            findings.append(f"{run.label}: median absolute error over {len(checked)} held-out point(s): {said}")
    if not rows:
        return None
    headers = ["run", "serving", "isl/osl", "conc"]
    for m in METRICS:
        headers += [f"{LABELS[m]} pred", "meas", "err"]
    return SectionTable(
        title=TITLE,
        headers=(*headers, "extrapolating"),
        rows=tuple(rows),
        note="Each point predicted by simulation (docs/predict.md) from per-role profiles fitted on the run's "
        "other points of the same serving (leave-one-out), with the engine limits of the run's recipe "
        "lock; err = (pred - meas) / meas.",
        findings=tuple(findings),
        words=("extrapolating",),
    )
