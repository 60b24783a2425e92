"""`pdbench`: the thin Typer layer. It parses, delegates and maps errors to exit codes."""

from __future__ import annotations

import logging
import shlex
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from harness import __version__
from harness.config.load import PROJECT_ROOT, ConfigError, ResolvedRecipe, load_recipe

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmark prefill/decode disaggregated vLLM serving on Slurm or on this machine.")

EXIT_CONFIG = 2


class Launcher(str, Enum):
    slurm = "slurm"
    local = "local"


SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Override a recipe field: key.path=value (YAML value). Repeatable.")]


def _fail(msg: str, code: int = EXIT_CONFIG) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _load(recipe: str, overrides: list[str] | None) -> ResolvedRecipe:
    try:
        return load_recipe(recipe, overrides or [])
    except ConfigError as e:
        _fail(str(e))
        raise  # unreachable; keeps type checkers happy


def _ensure_model(rr: ResolvedRecipe) -> None:
    """Build a model the catalogue knows how to make offline (the tiny model) when it is missing."""
    if rr.model.build == "tiny-llama" and rr.model.path is not None:
        path = Path(rr.model_source)
        if not (path / "config.json").is_file():
            from harness import tiny_model

            typer.echo(f"building the tiny model in {path}")
            tiny_model.build(path)


@app.command()
def render(
    recipe: Annotated[str, typer.Argument(help="Recipe name (recipes/<name>.yaml) or path.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write job.slurm and server.sh into.")],
    set_: SetOpt = None,
) -> None:
    """Render a recipe's job.slurm, server.sh and their data files into a directory."""
    from harness.render import current_context, render_job

    rr = _load(recipe, set_)
    out.mkdir(parents=True, exist_ok=True)
    try:
        render_job(rr, out, current_context(out, PROJECT_ROOT))
    except ConfigError as e:
        _fail(str(e))
    except FileExistsError as e:
        _fail(str(e))
    typer.echo(f"rendered {rr.name} into {out}")


@app.command()
def submit(
    recipe: Annotated[str, typer.Option("--recipe", "-r", help="Recipe name or path.")],
    set_: SetOpt = None,
    launcher: Annotated[Launcher, typer.Option(help="slurm: sbatch; local: this machine, no Slurm.")] = Launcher.slurm,
    dry_run: Annotated[bool, typer.Option(help="Create the run directory and print the sbatch command only.")] = False,
    results_dir: Annotated[Path, typer.Option(help="Root of run directories.")] = PROJECT_ROOT / "results",
) -> None:
    """Render a recipe into a new run directory and run it (sbatch, or the local launcher)."""
    from harness.launch import slurm
    from harness.render import current_context, render_job
    from harness.rundir import create_run_dir
    from harness.topology import check_single_host, plan

    rr = _load(recipe, set_)
    try:
        job_plan = plan(rr)
        if launcher is Launcher.local:
            check_single_host(rr, job_plan)
    except ConfigError as e:
        _fail(str(e))
    run_dir = create_run_dir(results_dir, rr.name)
    render_job(rr, run_dir, current_context(run_dir, PROJECT_ROOT))
    typer.echo(f"run directory: {run_dir}")

    if launcher is Launcher.slurm:
        cmd = slurm.sbatch_command(run_dir)
        if dry_run:
            typer.echo(shlex.join(cmd))
            return
        try:
            job_id = slurm.submit(run_dir)
        except slurm.SubmitError as e:
            _fail(str(e), code=1)
        typer.echo(f"submitted Slurm job {job_id}")
        return

    if dry_run:
        typer.echo(f"local launcher: would run {job_plan.num_nodes} node process(es) of {run_dir / 'server.sh'}")
        return
    from harness.launch.local import run_local

    _ensure_model(rr)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s pdbench %(levelname)s %(message)s")
    t = rr.recipe.timeouts
    rc = run_local(run_dir, job_plan.num_nodes, t.job_s, t.teardown_s)
    results = sorted(run_dir.glob("concurrency_*.json"))
    typer.echo(f"\n{'succeeded' if rc == 0 else f'FAILED (exit {rc})'}: {len(results)} result file(s) in {run_dir}")
    for r in results:
        typer.echo(f"  {r.name}")
    raise typer.Exit(rc)


@app.command()
def node(
    run_dir: Annotated[Path, typer.Option("--run-dir", help="The job's run directory.")],
    node_id: Annotated[Optional[int], typer.Option(help="Default: $SLURM_NODEID.")] = None,
) -> None:
    """Run this node's part of a job (called by server.sh inside the allocation)."""
    from harness.node.runtime import run_node

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s pdbench-node %(levelname)s %(message)s")
    raise typer.Exit(run_node(run_dir, node_id))


@app.command("tiny-model")
def tiny_model_cmd(
    out: Annotated[Path, typer.Argument(help="Directory to create.")] = PROJECT_ROOT / ".cache/models/tiny-llama",
) -> None:
    """Build the tiny Llama model directory offline (config + locally trained tokenizer)."""
    from harness import tiny_model

    typer.echo(str(tiny_model.build(out)))


@app.command()
def version() -> None:
    """Print pdbench's version."""
    typer.echo(__version__)


def _register_components() -> None:
    from harness.bench.cli import bench_command
    from harness.proxy.cli import proxy_command

    app.command("proxy", help="Run the PD proxy (prefill then decode, streamed back).")(proxy_command)
    app.command("bench", help="Benchmark an OpenAI-compatible endpoint over a concurrency sweep.")(bench_command)


_register_components()


def main() -> None:
    app()
