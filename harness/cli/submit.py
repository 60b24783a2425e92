"""`pdbench submit`: a recipe into a new run directory, launched; its Slurm options set recipe keys."""

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
from harness.config.overrides import Override


def slurm_records(options: dict[str, tuple[str, object]]) -> list[Override]:
    """The Slurm options given, as records of the recipe keys they set, so that the lock file's
    sources and an error name the option: {"--time": ("slurm.time_limit", "04:00:00")}."""
    return [Override.of(key, value, option) for option, (key, value) in options.items() if value is not None]


@command(
    "submit",
    "pdbench submit tiny-fp32-cpu-nixl-1p1d --launcher local --set benchmark.concurrency=[1,2]",
    "pdbench submit dsr1-fp8-h200-nixl-1p2d --cluster example-h200-nixl --time 04:00:00 --wait",
)
def submit(
    ctx: typer.Context,
    recipe_arg: RecipeArg = None,
    recipe_opt: RecipeOpt = None,
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    skip_flag_check: SkipFlagCheck = False,
    launcher: Annotated[
        Launcher, typer.Option(help="How to run the job: slurm (sbatch) or local (this machine, no Slurm).")
    ] = Launcher.slurm,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Create the run directory and print the sbatch command; submit nothing")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the job to its end, showing progress; Ctrl-C cancels it")
    ] = False,
    results_dir: ResultsOpt = RESULTS,
    partition: Annotated[str | None, typer.Option(help="sbatch --partition [default: the recipe's]")] = None,
    account: Annotated[str | None, typer.Option(help="sbatch --account [default: the recipe's]")] = None,
    qos: Annotated[str | None, typer.Option(help="sbatch --qos [default: the recipe's]")] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time", metavar="HH:MM:SS", help="sbatch --time, the job's wall clock [default: the recipe's, 02:00:00]"
        ),
    ] = None,
    nodelist: Annotated[str | None, typer.Option(help="sbatch --nodelist [default: the recipe's]")] = None,
    exclude: Annotated[str | None, typer.Option(help="sbatch --exclude [default: the recipe's]")] = None,
    reservation: Annotated[str | None, typer.Option(help="sbatch --reservation [default: the recipe's]")] = None,
    constraint: Annotated[str | None, typer.Option(help="sbatch --constraint [default: the recipe's]")] = None,
    gpus_per_node: Annotated[
        int | None,
        typer.Option(help="GPUs per node, 0 for CPU-only (topology.gpus_per_node) [default: the recipe's, 8]"),
    ] = None,
    job_name: Annotated[
        str | None, typer.Option(help="sbatch --job-name [default: the recipe's, else pdbench-<recipe>]")
    ] = None,
    sbatch: Annotated[
        list[str] | None,
        typer.Option(
            metavar="OPTION", help="Extra #SBATCH line, e.g. --sbatch=--mem=0; repeatable [default: the recipe's]"
        ),
    ] = None,
    resume: Annotated[
        str | None,
        typer.Option(
            metavar="RUN",
            help="A run (directory, id or short id, or a recipe name for its latest submitted run) of the same "
            "recipe: the new run "
            "keeps its complete, valid points and measures only the others [default: none]",
        ),
    ] = None,
    predict_from: Annotated[
        list[str] | None,
        typer.Option(
            metavar="RUN",
            help="A run measured before whose profile predicts every point before the job runs (repeatable: "
            "the first with each phase) [default: the newest run of the same model, cluster, connector and GPUs per "
            "node under --results-dir]",
        ),
    ] = None,
    predict: Annotated[
        bool,
        typer.Option(
            "--predict/--no-predict",
            help="Predict every point before the job runs (prediction.json; each result then keeps its prediction "
            "and error, docs/predict.md)",
        ),
    ] = True,
) -> None:
    """Render a recipe into a new run directory and run it (sbatch, or the local launcher)."""
    from harness.submit.pipeline import submit as submit_recipe

    name = recipe(ctx, recipe_arg, recipe_opt)
    records = overrides(
        set_,
        *slurm_records(
            {
                "--partition": ("slurm.partition", partition),
                "--account": ("slurm.account", account),
                "--qos": ("slurm.qos", qos),
                "--time": ("slurm.time_limit", time_limit),
                "--nodelist": ("slurm.nodelist", nodelist),
                "--exclude": ("slurm.exclude", exclude),
                "--reservation": ("slurm.reservation", reservation),
                "--constraint": ("slurm.constraint", constraint),
                "--gpus-per-node": ("topology.gpus_per_node", gpus_per_node),
                "--job-name": ("slurm.job_name", job_name),
                "--sbatch": ("slurm.extra_sbatch", list(sbatch) if sbatch else None),
            }
        ),
    )
    rc = delegate(
        lambda: submit_recipe(
            name,
            records,
            cluster,
            launcher_kind=launcher.value,
            skip_flag_check=skip_flag_check,
            dry_run=dry_run,
            wait=wait,
            results_dir=results_dir,
            resume=resume,
            predict_from=predict_from or (),
            predict=predict,
        )
    )
    raise typer.Exit(rc)
