"""`pdbench render`: a recipe's job files into a directory, without a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.options import ClusterOpt, RecipeArg, RecipeOpt, SetOpt, SkipFlagCheck, delegate, overrides, recipe
from harness.cli.root import command


@command("render", "pdbench render tiny-fp32-cpu-nixl-1p1d --out /tmp/job")
def render(
    out: Annotated[
        Path,
        typer.Option(
            "--out", metavar="DIR", help="Directory to write job.slurm and server.sh into (created if missing)"
        ),
    ],
    ctx: typer.Context,
    recipe_arg: RecipeArg = None,
    recipe_opt: RecipeOpt = None,
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    skip_flag_check: SkipFlagCheck = False,
) -> None:
    """Render a recipe's job.slurm, server.sh and their data files into a directory."""
    from harness.submit.pipeline import render_into

    name = recipe(ctx, recipe_arg, recipe_opt)
    records = overrides(set_)
    typer.echo(delegate(lambda: render_into(name, records, cluster, skip_flag_check, out)))
