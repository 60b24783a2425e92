"""`pdbench validate`: every check submit makes before it writes anything."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.cli.options import (
    ClusterOpt,
    Launcher,
    RecipeArg,
    RecipeOpt,
    SetOpt,
    SkipFlagCheck,
    delegate,
    overrides,
    recipe,
)
from harness.cli.root import command


@command("validate", "pdbench validate tiny-fp32-cpu-nixl-1p2d --cluster local --launcher local")
def validate(
    ctx: typer.Context,
    recipe_arg: RecipeArg = None,
    recipe_opt: RecipeOpt = None,
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    skip_flag_check: SkipFlagCheck = False,
    launcher: Annotated[
        Launcher,
        typer.Option(
            help="Check for this launcher: slurm (sbatch), or local (every node on this machine, ports job-wide)."
        ),
    ] = Launcher.slurm,
) -> None:
    """Check a recipe as submit would, without writing anything: schema, model catalogue, topology
    against the nodes' GPUs, ports (job-wide with --launcher local), a cluster profile that changes
    the hardware, vLLM flags, the shared install; then the cluster profile and what it set."""
    from harness.submit.check import validate as validate_recipe

    name = recipe(ctx, recipe_arg, recipe_opt)
    records = overrides(set_)
    typer.echo(delegate(lambda: validate_recipe(name, records, cluster, skip_flag_check, launcher.value)))
