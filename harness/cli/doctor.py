"""`pdbench doctor`: a recipe's needs checked on the nodes its job would get."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.cli.options import (
    RESULTS,
    ClusterOpt,
    Launcher,
    RecipeArg,
    RecipeOpt,
    ResultsOpt,
    SetOpt,
    SkipFlagCheck,
    delegate,
    overrides,
    recipe,
)
from harness.cli.root import command


@command("doctor", "pdbench doctor dsr1-fp8-h200-nixl-1p2d --cluster example-h200-nixl")
def doctor(
    ctx: typer.Context,
    recipe_arg: RecipeArg = None,
    recipe_opt: RecipeOpt = None,
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    launcher: Annotated[
        Launcher, typer.Option(help="Check the nodes of a short Slurm job, or this machine (local launcher).")
    ] = Launcher.slurm,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the findings as one JSON object [default: one line per problem]")
    ] = False,
    timeout_s: Annotated[
        float, typer.Option(help="Give up (and cancel the check job) after this many seconds, queue time included")
    ] = 900,
    results_dir: ResultsOpt = RESULTS,
    skip_flag_check: SkipFlagCheck = False,
) -> None:
    """Check everything a recipe's job needs on the nodes it would get: image, pdbench in the image,
    weights, GPUs, ports, RDMA, memory, disk, clocks; and its vLLM flags here. Exit 0 when all pass."""
    from harness.doctor.check_job import doctor as run_doctor

    name = recipe(ctx, recipe_arg, recipe_opt)
    records = overrides(set_)
    rc = delegate(
        lambda: run_doctor(
            name,
            records,
            cluster,
            launcher_kind=launcher.value,
            as_json=as_json,
            timeout_s=timeout_s,
            results_dir=results_dir,
            skip_flag_check=skip_flag_check,
        )
    )
    raise typer.Exit(rc)
