"""`pdbench cancel`: a run's job cancelled; the job tears itself down."""

from __future__ import annotations

import typer

from harness.cli.options import RESULTS, ResultsOpt, RunArg, delegate, run_dir
from harness.cli.root import command


@command("cancel", "pdbench cancel tiny-fp32-cpu-nixl-1p1d")
def cancel(run: RunArg, results_dir: ResultsOpt = RESULTS) -> None:
    """Cancel a run's job (scancel, or SIGTERM to the local launcher); the job tears every process down."""
    from harness.submit.manage import cancel as cancel_job

    found = run_dir(run, results_dir)
    typer.echo(delegate(lambda: cancel_job(found)))
