"""`pdbench predict`: a recipe's predicted TTFT, TPOT and throughput per concurrency, from profiles
fitted on earlier runs; nothing is submitted or run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.options import ClusterOpt, SetOpt, delegate, fail, overrides
from harness.cli.root import command


@command(
    "predict",
    "pdbench predict llama8b-shape-bf16-h200x2-nixl-1p1d --from results/llama8b-shape-bf16-h200x1-nixl-1p1d/latest",
    "pdbench predict tiny-fp32-cpu-nixl-1p2d --set benchmark.concurrency=[1,8,32] --from RUN1 --from RUN2",
)
def predict(
    recipe: Annotated[
        str, typer.Argument(metavar="RECIPE", show_default=False, help="Recipe name (recipes/<name>.yaml) or a path")
    ],
    runs: Annotated[
        list[Path],
        typer.Option(
            "--from",
            metavar="RUN",
            show_default=False,
            help="Run whose points give the profiles (repeatable; the first of the phase wins) [required]",
        ),
    ],
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
) -> None:
    """Predict a recipe's deployment (xP+yD and its aggregated baseline) at each concurrency of its
    sweep: TTFT/TPOT percentiles and output throughput per GPU, by simulating prefill and decode
    queues with per-role profiles fitted on the named runs (stored in each as perf_profile.json).
    Says where a prediction extrapolates beyond what the runs measured. Runs nothing."""
    from harness.predict.answer import PredictError, answer, render
    from harness.submit.check import load

    for run in runs:
        if not run.is_dir():
            fail(f"--from {run}: no such run directory")
    rr = delegate(lambda: load(recipe, overrides(set_), cluster))
    try:
        typer.echo(render(answer(rr, runs)))
    except PredictError as e:
        fail(str(e))
