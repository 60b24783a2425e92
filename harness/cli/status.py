"""`pdbench status`: the recent runs, or one run's job state, outcome and points."""

from __future__ import annotations

import shutil
import sys
from typing import Annotated

import typer

from harness.cli.options import RESULTS, RUN_HELP, ResultsOpt, run_dir
from harness.cli.root import command


@command("status", "pdbench status", "pdbench status tiny-fp32-cpu-nixl-1p1d --json")
def status(
    run: Annotated[
        str | None,
        typer.Argument(metavar="RUN", help=f"{RUN_HELP} [default: list the recent runs, newest first, like squeue]"),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON: a list of runs, or the one run's object [default: off]")
    ] = False,
    limit: Annotated[int, typer.Option(help="Runs to list, newest first (0: all)")] = 20,
    results_dir: ResultsOpt = RESULTS,
) -> None:
    """Without RUN: the recent runs (recipe, short id, launcher, state, time, points valid/total).
    With RUN: its job state (Slurm or local launcher), outcome and points."""
    from harness.submit.manage import status_lines
    from harness.submit.runs import status_json, status_listing

    if run is None:
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        lines = status_listing(results_dir, limit, as_json, width)
    else:
        found = run_dir(run, results_dir)
        lines = [status_json(found)] if as_json else status_lines(found)
    for line in lines:
        typer.echo(line)
