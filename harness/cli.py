"""`pdbench`: the thin Typer layer. It parses, delegates and maps errors to exit codes."""

from __future__ import annotations

import inspect
import json
import logging
import shutil
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer

from harness import __version__, exit_codes
from harness.cli_help import Command, Group
from harness.config.load import PROJECT_ROOT
from harness.submit.refused import Refused

if TYPE_CHECKING:
    from harness.rundir import RunDir

# Help is Click's plain formatter (rich_markup_mode=None), not Rich's panels: Rich shrinks the
# option-name column to fit the terminal and cuts names ("--health-check-inte…"), while Click
# always writes a name whole (its help moves to the next line) and never narrows below 50
# columns. Up to 100 columns are used when the terminal has them (Click's own cap is 80).
# Every command is a harness.cli_help.Command: metavars, defaults and usage in one style.
app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100, "help_option_names": ["-h", "--help"]},
    help="Benchmark prefill/decode disaggregated vLLM serving on Slurm or on this machine.",
    epilog="Start with `pdbench recipes`, then `pdbench validate RECIPE` and `pdbench submit RECIPE`.",
)


def _example(*lines: str) -> str:
    """A command's help epilog: its examples, kept as written (Click's \\b: no rewrapping)."""
    return "Example:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print pdbench's version and exit."),
    ] = False,
) -> None:
    """Benchmark prefill/decode disaggregated vLLM serving on Slurm or on this machine."""


class Launcher(str, Enum):
    slurm = "slurm"
    local = "local"


SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a recipe field: key.path=value (YAML value); repeatable [default: none]",
    ),
]

# One way to name the recipe: `pdbench submit RECIPE` or `pdbench submit --recipe RECIPE`.
RecipeArg = Annotated[
    str | None,
    typer.Argument(
        metavar="RECIPE",
        show_default=False,
        help="Recipe name (recipes/<name>.yaml; `pdbench recipes` lists them) or path; or give --recipe",
    ),
]
RecipeOpt = Annotated[
    str | None,
    typer.Option("--recipe", "-r", metavar="RECIPE", help="The recipe, as the argument names it [default: none]"),
]


def _recipe(ctx: typer.Context, argument: str | None, option: str | None) -> str:
    """The recipe named by the argument or by --recipe (the same one if both); else a usage error, exit 2."""
    if argument and option and argument != option:
        ctx.fail(f"two recipes named: {argument!r} and --recipe {option!r}; name one")
    name = argument or option
    if not name:
        ctx.fail("name a recipe: RECIPE or --recipe RECIPE (`pdbench recipes` lists them)")
    return name


ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        metavar="PROFILE",
        help=(
            "Cluster profile: a name (clusters/<name>.yaml; see docs/clusters.md for the search order) or a "
            "file; its settings override the recipe's, --set overrides both [default: $PDBENCH_CLUSTER, else none]"
        ),
    ),
]


RUN_HELP = (
    "A run: its directory, its id or short id (as `pdbench status` lists them), recipe/short-id, "
    "or a recipe name (its latest submitted run)"
)
RunArg = Annotated[str, typer.Argument(metavar="RUN", help=RUN_HELP, show_default=False)]
ResultsOpt = Annotated[Path, typer.Option(metavar="DIR", help="Root directory of run directories")]


def _fail(msg: str, code: int = exit_codes.USAGE) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


T = TypeVar("T")


def _delegate(step: Callable[[], T]) -> T:
    """Run a pipeline step; what it refuses becomes `error: ...` and its exit code."""
    try:
        return step()
    except Refused as e:
        _fail(str(e), e.code)


@app.command(cls=Command, epilog=_example("pdbench render tiny-fp32-cpu-nixl-1p1d --out /tmp/job"))
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
    from harness.submit.run import render_into

    recipe = _recipe(ctx, recipe_arg, recipe_opt)
    typer.echo(_delegate(lambda: render_into(recipe, set_, cluster, skip_flag_check, out)))


@app.command(cls=Command, epilog=_example("pdbench validate tiny-fp32-cpu-nixl-1p2d --cluster local --launcher local"))
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

    recipe = _recipe(ctx, recipe_arg, recipe_opt)
    typer.echo(_delegate(lambda: validate_recipe(recipe, set_, cluster, skip_flag_check, launcher.value)))


SkipFlagCheck = Annotated[
    bool,
    typer.Option(
        "--skip-flag-check",
        help=(
            "Do not parse the `vllm serve` lines with the installed vLLM's parser "
            "[default: parse them whenever vLLM imports]"
        ),
    ),
]


@app.command(
    cls=Command,
    epilog=_example(
        "pdbench submit tiny-fp32-cpu-nixl-1p1d --launcher local --set benchmark.concurrency=[1,2]",
        "pdbench submit dsr1-fp8-h200-nixl-1p2d --cluster example-h200-nixl --time 04:00:00 --wait",
    ),
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
    results_dir: ResultsOpt = PROJECT_ROOT / "results",
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
) -> None:
    """Render a recipe into a new run directory and run it (sbatch, or the local launcher)."""
    from harness.submit.check import slurm_overrides

    recipe = _recipe(ctx, recipe_arg, recipe_opt)
    from harness.submit.run import submit as submit_recipe

    overrides = list(set_ or []) + slurm_overrides(
        partition=partition,
        account=account,
        qos=qos,
        time=time_limit,
        nodelist=nodelist,
        exclude=exclude,
        reservation=reservation,
        constraint=constraint,
        gpus_per_node=gpus_per_node,
        job_name=job_name,
        sbatch=sbatch,
    )
    rc = _delegate(
        lambda: submit_recipe(
            recipe,
            overrides,
            cluster,
            launcher_kind=launcher.value,
            skip_flag_check=skip_flag_check,
            dry_run=dry_run,
            wait=wait,
            results_dir=results_dir,
            resume=resume,
        )
    )
    raise typer.Exit(rc)


@app.command(
    cls=Command,
    epilog=_example(
        "pdbench search local-tiny-pd --cluster local",
        "pdbench search searches/my-h200.yaml --search-dir results/searches/h200-try2",
    ),
)
def search(
    name: Annotated[
        str,
        typer.Argument(
            metavar="SEARCH",
            show_default=False,
            help="Search file: a name (searches/<name>.yaml) or a path",
        ),
    ],
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    launcher: Annotated[
        Launcher, typer.Option(help="How to run each candidate's job: slurm (sbatch) or local (this machine).")
    ] = Launcher.slurm,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--search-dir",
            metavar="DIR",
            help="The search directory; running again with the same one resumes the search "
            "[default: <results-dir>/searches/<search name>]",
        ),
    ] = None,
    results_dir: ResultsOpt = PROJECT_ROOT / "results",
    skip_flag_check: SkipFlagCheck = False,
) -> None:
    """Find the best deployment: run a search file's candidates (xP+yD, per-role parallelism, any
    recipe key) as jobs, each up its concurrency ladder to the highest point that meets the SLO, and
    report the winner per SLO with its confidence interval, the aggregated baseline and the cost.
    Running it again resumes: finished candidates are kept."""
    from harness.search.run import prepare

    rc = _delegate(
        lambda: prepare(
            name,
            search_dir=directory,
            results_dir=results_dir,
            launcher_kind=launcher.value,
            cluster=cluster,
            overrides=list(set_ or []),
            skip_flag_check=skip_flag_check,
        ).run()
    )
    raise typer.Exit(rc)


@app.command(cls=Command, epilog=_example("pdbench doctor dsr1-fp8-h200-nixl-1p2d --cluster example-h200-nixl"))
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
    results_dir: ResultsOpt = PROJECT_ROOT / "results",
) -> None:
    """Check everything a recipe's job needs on the nodes it would get: image, pdbench in the image,
    weights, GPUs, ports, RDMA, memory, disk, clocks; and its vLLM flags here. Exit 0 when all pass."""
    from harness.doctor.run import doctor as run_doctor

    recipe = _recipe(ctx, recipe_arg, recipe_opt)
    rc = _delegate(
        lambda: run_doctor(
            recipe,
            set_,
            cluster,
            launcher_kind=launcher.value,
            as_json=as_json,
            timeout_s=timeout_s,
            results_dir=results_dir,
        )
    )
    raise typer.Exit(rc)


def _run(ref: str, results_dir: Path) -> RunDir:
    from harness.submit.run import resolve_run

    return _delegate(lambda: resolve_run(ref, results_dir))


@app.command(cls=Command, epilog=_example("pdbench recipes", "pdbench recipes --json"))
def recipes(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object [default: a list for people to read]")
    ] = False,
) -> None:
    """List the recipes and the cluster profiles there are to name, with their descriptions."""
    from harness.config.listing import listing, listing_lines

    if as_json:
        typer.echo(json.dumps(listing(PROJECT_ROOT), indent=2))
        return
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    for line in listing_lines(PROJECT_ROOT, width):
        typer.echo(line)


@app.command(cls=Command, epilog=_example("pdbench status", "pdbench status tiny-fp32-cpu-nixl-1p1d --json"))
def status(
    run: Annotated[
        str | None,
        typer.Argument(metavar="RUN", help=f"{RUN_HELP} [default: list the recent runs, newest first, like squeue]"),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON: a list of runs, or the one run's object [default: off]")
    ] = False,
    limit: Annotated[int, typer.Option(help="Runs to list, newest first (0: all)")] = 20,
    results_dir: ResultsOpt = PROJECT_ROOT / "results",
) -> None:
    """Without RUN: the recent runs (recipe, short id, launcher, state, time, points valid/total).
    With RUN: its job state (Slurm or local launcher), outcome and points."""
    from harness.submit.manage import status_lines
    from harness.submit.runs import status_json, status_listing

    if run is None:
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        lines = status_listing(results_dir, limit, as_json, width)
    else:
        run_dir = _run(run, results_dir)
        lines = [status_json(run_dir)] if as_json else status_lines(run_dir)
    for line in lines:
        typer.echo(line)


class LogRole(str, Enum):
    prefill = "prefill"
    decode = "decode"
    proxy = "proxy"
    bench = "bench"
    node = "node"


@app.command(
    cls=Command,
    epilog=_example(
        "pdbench logs tiny-fp32-cpu-nixl-1p1d --role decode -n 100", "pdbench logs tiny-fp32-cpu-nixl-1p1d --follow"
    ),
)
def logs(
    run: RunArg,
    node: Annotated[int | None, typer.Option(help="Only this node's logs, by index [default: every node]")] = None,
    role: Annotated[LogRole | None, typer.Option(help="Only this role's logs [default: every role]")] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines to print from the end of each log (0: all)")] = 50,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Then print new lines as they come, until the job ends (Ctrl-C stops following)"
        ),
    ] = False,
    results_dir: ResultsOpt = PROJECT_ROOT / "results",
) -> None:
    """Print the logs of a run, by node and role."""
    from harness.submit.log_follow import follow_logs
    from harness.submit.manage import log_blocks

    run_dir = _run(run, results_dir)
    if follow:
        raise typer.Exit(_delegate(lambda: follow_logs(run_dir, node, role.value if role else None, lines, sys.stdout)))
    for block in _delegate(lambda: log_blocks(run_dir, node, role.value if role else None, lines)):
        typer.echo(block)


@app.command(cls=Command, epilog=_example("pdbench cancel tiny-fp32-cpu-nixl-1p1d"))
def cancel(run: RunArg, results_dir: ResultsOpt = PROJECT_ROOT / "results") -> None:
    """Cancel a run's job (scancel, or SIGTERM to the local launcher); the job tears every process down."""
    from harness.submit.manage import cancel as cancel_job

    run_dir = _run(run, results_dir)
    typer.echo(_delegate(lambda: cancel_job(run_dir)))


@app.command(cls=Command, epilog=_example("pdbench node --run-dir results/tiny-fp32-cpu-nixl-1p1d/RUN --node-id 0"))
def node(
    run_dir: Annotated[Path, typer.Option("--run-dir", metavar="DIR", help="The job's run directory")],
    node_id: Annotated[int | None, typer.Option(help="This node's index in the job [default: $SLURM_NODEID]")] = None,
) -> None:
    """Run this node's part of a job (called by server.sh inside the allocation)."""
    from harness.node.runtime import run_node

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s pdbench-node %(levelname)s %(message)s"
    )
    raise typer.Exit(run_node(run_dir, node_id))


@app.command("tiny-model", cls=Command, epilog=_example("pdbench tiny-model /tmp/tiny-llama"))
def tiny_model_cmd(
    out: Annotated[Path, typer.Argument(metavar="DIR", help="Directory to create")] = PROJECT_ROOT
    / ".cache/models/tiny-llama",
) -> None:
    """Build the tiny Llama model directory offline (config + locally trained tokenizer)."""
    from harness import tiny_model

    typer.echo(str(tiny_model.build(out)))


@app.command(cls=Command, epilog=_example("pdbench version"))
def version() -> None:
    """Print pdbench's version."""
    typer.echo(__version__)


def _register_components() -> None:
    from harness.bench.cli import bench_command
    from harness.bench.trace_gen import trace_generate_command
    from harness.mock_engine.cli import mock_engine_command
    from harness.node.nic_cli import nic_command
    from harness.proxy.cli import proxy_command
    from harness.report.cli import collect_command, report_command

    def component(name: str, help_: str, *examples: str) -> Callable[[Callable[..., None]], object]:
        return app.command(name, cls=Command, help=help_, epilog=_example(*examples))

    component(
        "proxy",
        "Run the PD proxy (prefill then decode, streamed back).",
        "pdbench proxy --prefill http://p0:8100 --decode http://d0:8200 --decode http://d1:8200",
    )(proxy_command)
    component(
        "bench",
        "Benchmark an OpenAI-compatible endpoint over a concurrency sweep.",
        "pdbench bench --base-url http://127.0.0.1:30000 --model M --tokenizer T \\",
        "    --isl 1024 --osl 128 --concurrency 1,4,16 --results-dir out/",
    )(bench_command)
    component("nic", "Detect RDMA NICs and print the UCX/NCCL/NIXL environment for this node.", "pdbench nic --json")(
        nic_command
    )
    component(
        "report",
        "Compare runs: tables (md/csv/html/json) with baseline deltas, Pareto plot.",
        "pdbench report tiny-fp32-cpu-nixl-1p1d tiny-fp32-cpu-nixl-1p2d --baseline tiny-fp32-cpu-nixl-1p1d",
    )(report_command)
    component(
        "collect",
        "Write the InferenceX-style aggregate JSON of runs (validated, deduplicated).",
        "pdbench collect tiny-fp32-cpu-nixl-1p1d --out agg.json --hw cpu",
    )(collect_command)
    component(
        "trace-generate",
        "Generate a Mooncake-format trace of multi-turn sessions that share prompt blocks.",
        "pdbench trace-generate sessions.jsonl --sessions 50 --turns 4 --rate 2 --block-tokens 512",
    )(trace_generate_command)
    component(
        "mock-engine",
        "Run a mock OpenAI-compatible engine (tests, benchmarks, plumbing checks).",
        "pdbench mock-engine --port 8000 --ttft-ms 50 --itl-ms 10",
    )(mock_engine_command)


_register_components()


def _whole_summaries() -> None:
    """`pdbench --help` lists each command with its whole first paragraph, wrapped: Click
    would cut a summary that is longer than the room left at that width with "..."."""
    for info in app.registered_commands:
        if info.short_help is None:
            text = info.help or inspect.getdoc(info.callback) or ""
            info.short_help = " ".join(text.split("\n\n")[0].split())


_whole_summaries()


def main() -> None:
    app()
