"""`pdbench`: the thin Typer layer. It parses, delegates and maps errors to exit codes."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import shlex
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from harness import __version__
from harness.config.load import PROJECT_ROOT, ConfigError, ResolvedRecipe, load_recipe

# Help is Click's plain formatter (rich_markup_mode=None), not Rich's panels: Rich shrinks the
# option-name column to fit the terminal and cuts names ("--health-check-inte…"), while Click
# always writes a name whole (its help moves to the next line) and never narrows below 50
# columns. Up to 100 columns are used when the terminal has them (Click's own cap is 80).
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
    help="Benchmark prefill/decode disaggregated vLLM serving on Slurm or on this machine.",
)

EXIT_CONFIG = 2


class Launcher(str, Enum):
    slurm = "slurm"
    local = "local"


SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe field: key.path=value (YAML value); repeatable [default: none]."),
]


ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        help=(
            "Cluster profile: a name (clusters/<name>.yaml; see docs/clusters.md for the search order) or a "
            "file; its settings override the recipe's, --set overrides both [default: $PDBENCH_CLUSTER, else none]"
        ),
    ),
]


def _fail(msg: str, code: int = EXIT_CONFIG) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _load(recipe: str, overrides: list[str] | None, cluster: str | None = None) -> ResolvedRecipe:
    from harness.config.cluster import chosen_profile

    try:
        return load_recipe(recipe, overrides or [], cluster=chosen_profile(cluster))
    except ConfigError as e:
        _fail(str(e))
        raise  # unreachable; keeps type checkers happy


def _ensure_model(rr: ResolvedRecipe) -> None:
    """Build a model the catalogue knows how to make offline (the tiny model) when it is missing."""
    if rr.model.build == "tiny-llama" and rr.model.path is not None:
        path = Path(rr.model_source)
        if not (path / "config.json").is_file():
            from harness import tiny_model

            typer.echo(f"building the tiny model in {path}", err=True)  # stdout may be --json
            tiny_model.build(path)


@app.command()
def render(
    recipe: Annotated[str, typer.Argument(help="Recipe name (recipes/<name>.yaml) or path.")],
    out: Annotated[
        Path, typer.Option("--out", help="Directory to write job.slurm and server.sh into (created if missing).")
    ],
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    skip_flag_check: SkipFlagCheck = False,
) -> None:
    """Render a recipe's job.slurm, server.sh and their data files into a directory."""
    from harness.render import current_context, render_job

    rr = _load(recipe, set_, cluster)
    _check_flags(rr, skip_flag_check)
    out.mkdir(parents=True, exist_ok=True)
    try:
        render_job(rr, out, current_context(out, PROJECT_ROOT, rr))
    except ConfigError as e:
        _fail(str(e))
    except FileExistsError as e:
        _fail(str(e))
    typer.echo(f"rendered {rr.name} into {out}")


@app.command()
def validate(
    recipe: Annotated[str, typer.Argument(help="Recipe name (recipes/<name>.yaml) or path.")],
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    skip_flag_check: SkipFlagCheck = False,
) -> None:
    """Check a recipe (schema, model catalogue, topology, ports, vLLM flags) without rendering anything."""
    from harness.topology import plan

    rr = _load(recipe, set_, cluster)
    try:
        p = plan(rr)
    except ConfigError as e:
        _fail(str(e))
    _check_flags(rr, skip_flag_check)
    topo = rr.recipe.topology
    typer.echo(
        f"ok: {rr.name} ({rr.recipe_file}): model {rr.recipe.model}, "
        f"{topo.prefill.workers}P+{topo.decode.workers}D on {p.num_nodes} node(s), "
        f"connector {rr.recipe.connector.name}, fingerprint {rr.fingerprint}"
    )


def _flag_problems(rr: ResolvedRecipe) -> list[str]:
    """The job's `vllm serve` lines through vLLM's own parser, where vLLM is importable here."""
    from harness.render import vllm_flags
    from harness.render.commands import serve_lines
    from harness.topology import plan

    lines = serve_lines(rr, plan(rr))
    try:
        # vLLM logs to stdout as it imports; stdout is for pdbench's own output (--json).
        with contextlib.redirect_stdout(sys.stderr):
            problems = vllm_flags.check_many(
                [argv for _, argv, _ in lines],
                [origins for _, _, origins in lines],
                cache_dir=PROJECT_ROOT / ".cache" / "vllm-flag-check",
            )
    except vllm_flags.VllmUnavailable:
        return []
    note = vllm_flags.image_version_note(rr.recipe.container.image, vllm_flags.vllm_version())
    if note:
        typer.echo(f"note: {note}", err=True)
    return [f"vLLM rejects a flag: {p}" for p in problems]


def _check_flags(rr: ResolvedRecipe, skip: bool) -> None:
    if skip:
        return
    problems = _flag_problems(rr)
    if problems:
        _fail("\n".join(problems))


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


def _slurm_overrides(**opts: object) -> list[str]:
    """Command-line Slurm options become ordinary recipe overrides, so the lock file records them."""
    keys = {
        "partition": "slurm.partition",
        "account": "slurm.account",
        "qos": "slurm.qos",
        "time": "slurm.time_limit",
        "nodelist": "slurm.nodelist",
        "exclude": "slurm.exclude",
        "reservation": "slurm.reservation",
        "constraint": "slurm.constraint",
        "job_name": "slurm.job_name",
        "gpus_per_node": "topology.gpus_per_node",
    }
    out = [
        f"{keys[k]}={json.dumps(v) if isinstance(v, str) else v}"
        for k, v in opts.items()
        if k in keys and v is not None
    ]
    if opts.get("sbatch"):
        out.append(f"slurm.extra_sbatch={json.dumps(list(opts['sbatch']))}")  # type: ignore[call-overload]
    return out


@app.command()
def submit(
    recipe: Annotated[str, typer.Option("--recipe", "-r", help="Recipe name (recipes/<name>.yaml) or path.")],
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    skip_flag_check: SkipFlagCheck = False,
    launcher: Annotated[
        Launcher, typer.Option(help="How to run the job: slurm (sbatch) or local (this machine, no Slurm).")
    ] = Launcher.slurm,
    dry_run: Annotated[
        bool, typer.Option(help="Create the run directory and print the sbatch command; submit nothing.")
    ] = False,
    wait: Annotated[
        bool, typer.Option(help="Follow the Slurm job to its end, showing progress; Ctrl-C cancels it.")
    ] = False,
    results_dir: Annotated[Path, typer.Option(help="Root directory of run directories.")] = PROJECT_ROOT / "results",
    partition: Annotated[str | None, typer.Option(help="sbatch --partition [default: the recipe's]")] = None,
    account: Annotated[str | None, typer.Option(help="sbatch --account [default: the recipe's]")] = None,
    qos: Annotated[str | None, typer.Option(help="sbatch --qos [default: the recipe's]")] = None,
    time_limit: Annotated[
        str | None,
        typer.Option("--time", help="sbatch --time, wall clock as HH:MM:SS [default: the recipe's, 02:00:00]"),
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
        typer.Option(help="Extra #SBATCH line, e.g. --sbatch=--mem=0; repeatable [default: the recipe's]"),
    ] = None,
    resume: Annotated[
        str | None,
        typer.Option(
            help="A run (directory, or a recipe name for its latest run) of the same recipe: the new run "
            "keeps its complete, valid points and measures only the others [default: none]"
        ),
    ] = None,
) -> None:
    """Render a recipe into a new run directory and run it (sbatch, or the local launcher)."""
    from dataclasses import replace

    from harness.launch import slurm
    from harness.render import current_context, render_job
    from harness.rundir import RunDir
    from harness.topology import check_single_host, plan

    overrides = list(set_ or []) + _slurm_overrides(
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
    rr = _load(recipe, overrides, cluster)
    try:
        job_plan = plan(rr)
        if launcher is Launcher.local:
            check_single_host(rr, job_plan)
    except ConfigError as e:
        _fail(str(e))
    _check_flags(rr, skip_flag_check)
    _check_storage(rr)
    resumed = _run_dir(resume, results_dir).resolve() if resume else None
    if resumed is not None:
        from harness.resume_run import check_same_measurement

        try:
            check_same_measurement(resumed, rr)
        except ConfigError as e:
            _fail(str(e))
    run_dir = RunDir.create(results_dir, rr.name).path
    try:
        ctx = current_context(run_dir, PROJECT_ROOT, rr)
        render_job(rr, run_dir, replace(ctx, resumed_from=str(resumed)) if resumed else ctx)
    except ConfigError as e:  # e.g. a results directory that no #SBATCH line can carry
        _fail(f"{e} (run directory {run_dir} left unrendered)")
    typer.echo(f"run directory: {run_dir}")
    if resumed is not None:
        from harness.resume_run import carry_over

        kept = carry_over(resumed, run_dir)
        typer.echo(f"resuming {resumed}: {len(kept)} finished point(s) kept, the others will be measured")

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
        if wait:
            raise typer.Exit(_follow(run_dir, job_id, rr.recipe.timeouts.job_s))
        return

    if dry_run:
        typer.echo(
            f"local launcher: would run {job_plan.num_nodes} node process(es) of {RunDir(run_dir).server_script}"
        )
        return
    from harness.launch.local import run_local

    logging.basicConfig(level=logging.INFO, format="%(asctime)s pdbench %(levelname)s %(message)s")
    t = rr.recipe.timeouts
    rc = run_local(run_dir, job_plan.num_nodes, t.job_s, t.teardown_s)
    _summary(run_dir, rc)
    raise typer.Exit(rc)


def _check_storage(rr: ResolvedRecipe) -> None:
    """Weights and the shared install, checked here when this host sees them (else on every node)."""
    from harness.doctor import local_findings

    _ensure_model(rr)
    findings = local_findings(rr, str(rr.root))
    if findings:
        _fail("\n".join(str(f) for f in findings))


@app.command()
def doctor(
    recipe: Annotated[str, typer.Option("--recipe", "-r", help="Recipe name (recipes/<name>.yaml) or path.")],
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    launcher: Annotated[
        Launcher, typer.Option(help="Check the nodes of a short Slurm job, or this machine (local launcher).")
    ] = Launcher.slurm,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the findings as one JSON object [default: one line per problem].")
    ] = False,
    timeout_s: Annotated[
        float, typer.Option(help="Give up (and cancel the check job) after this many seconds, queue time included.")
    ] = 900,
    results_dir: Annotated[Path, typer.Option(help="Root directory of run directories.")] = PROJECT_ROOT / "results",
) -> None:
    """Check everything a recipe's job needs on the nodes it would get: image, pdbench in the image,
    weights, GPUs, ports, RDMA, memory, disk, clocks; and its vLLM flags here. Exit 0 when all pass."""
    from harness import doctor as dr
    from harness.launch import slurm
    from harness.render import current_context, render_job
    from harness.rundir import RunDir
    from harness.topology import check_single_host, plan

    rr = _load(recipe, set_, cluster)
    try:
        job_plan = plan(rr)
        if launcher is Launcher.local:
            check_single_host(rr, job_plan)
    except ConfigError as e:
        _fail(str(e))
    _ensure_model(rr)
    findings = [dr.Finding(dr.SUBMIT_HOST, "vllm-flags", p) for p in _flag_problems(rr)]
    findings += dr.local_findings(rr, str(rr.root))
    # The check job's run directory is kept apart from the benchmark runs (results/.doctor/).
    run_dir = RunDir.create(results_dir / ".doctor", rr.name).path
    try:
        render_job(rr, run_dir, current_context(run_dir, PROJECT_ROOT, rr))
    except ConfigError as e:
        _fail(str(e))
    dr.mark_doctor_run(run_dir)
    if not as_json:
        typer.echo(f"checking {job_plan.num_nodes} node(s) of {rr.name} ({launcher.value}); run directory {run_dir}")
    start = time.monotonic()
    if launcher is Launcher.local:
        from harness.launch.local import run_local

        run_local(run_dir, job_plan.num_nodes, min(timeout_s, 300), rr.recipe.timeouts.teardown_s, echo=None)
    else:
        job_id = None
        try:
            job_id = slurm.submit(run_dir, extra=["--time=00:10:00"])
            slurm.wait(job_id, timeout_s, lambda info: None)
        except slurm.SubmitError as e:
            findings.append(dr.Finding("job", "slurm", str(e)))
            if job_id is not None:
                slurm.cancel(job_id)
    findings += dr.job_findings(run_dir, job_plan.num_nodes)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "ok": not findings,
                    "recipe": rr.name,
                    "run_dir": str(run_dir),
                    "seconds": round(time.monotonic() - start, 1),
                    "problems": [f.to_json() for f in findings],
                },
                indent=2,
            )
        )
    else:
        for f in findings:
            typer.echo(str(f))
        typer.echo(
            f"{'ok' if not findings else f'{len(findings)} problem(s)'}: {job_plan.num_nodes} node(s) checked "
            f"in {time.monotonic() - start:.1f} s"
        )
    raise typer.Exit(0 if not findings else 1)


def _summary(run_dir: Path, rc: int) -> None:
    from harness.rundir import RunDir, read_status

    results = RunDir(run_dir).results()
    typer.echo(f"\n{'succeeded' if rc == 0 else f'FAILED (exit {rc})'}: {len(results)} result file(s) in {run_dir}")
    for r in results:
        typer.echo(f"  {r.name}")
    status = read_status(RunDir(run_dir))
    if rc != 0 and status and status.get("reason"):
        typer.echo(f"reason: {status['reason']}")


def _follow(run_dir: Path, job_id: str, timeout_s: float) -> int:
    """Show state changes and the benchmark's progress until the job ends; Ctrl-C cancels it."""
    from harness.launch import slurm
    from harness.launch.local import LogTail
    from harness.rundir import RunDir

    tail = LogTail([RunDir(run_dir).log("node0"), RunDir(run_dir).log("bench")], sys.stdout)
    last: list[str] = []

    def on_poll(info: slurm.JobInfo) -> None:
        if info.state not in last:
            typer.echo(
                f"job {job_id}: {info.state}" + (f" ({info.reason})" if info.reason not in (None, "None") else "")
            )
            last.append(info.state)
        tail.pump()

    try:
        info = slurm.wait(job_id, timeout_s + 600, on_poll)
    except KeyboardInterrupt:
        typer.echo(f"\ninterrupted: cancelled Slurm job {job_id}", err=True)
        return 130
    except slurm.SubmitError as e:
        typer.echo(f"error: {e}", err=True)
        return 1
    # The job's status.json is the authority on success; Slurm's state covers what it cannot see.
    # On NFS another host's new file can take a few seconds (attribute caching) to appear here.
    from harness.rundir import RunDir, read_status

    status = read_status(RunDir(run_dir))
    settle = time.monotonic() + 10
    while (status is None or status.get("finished_at") is None) and time.monotonic() < settle:
        time.sleep(1)
        status = read_status(RunDir(run_dir))
    tail.pump()
    ok = info.state == "COMPLETED" and status is not None and status["state"] == "succeeded"
    if info.state == "UNKNOWN" and status is not None:
        ok = status["state"] == "succeeded"
    rc = 0 if ok else 1
    typer.echo(f"job {job_id} ended: {info.state}")
    _summary(run_dir, rc)
    return rc


def _run_dir(run: str, results_dir: Path) -> Path:
    from harness.rundir import RunDir, RunNotFound

    try:
        return RunDir.resolve(run, results_dir).path
    except RunNotFound as e:
        _fail(str(e))
        raise


RunArg = Annotated[str, typer.Argument(help="Run directory, or a recipe name (its latest run).")]
ResultsOpt = Annotated[Path, typer.Option(help="Root directory of run directories.")]


@app.command()
def status(run: RunArg, results_dir: ResultsOpt = PROJECT_ROOT / "results") -> None:
    """Show a run's Slurm state, its outcome and its result files."""
    from harness.launch import slurm
    from harness.rundir import RunDir, read_status

    run_dir = _run_dir(run, results_dir)
    typer.echo(f"run: {run_dir}")
    job_id = slurm.job_id_of(run_dir)
    if job_id:
        try:
            info = slurm.job_info(job_id)
            typer.echo(
                f"slurm job {job_id}: {info.state} (exit {info.exit_code}, nodes {info.nodes}, via {info.source})"
            )
        except slurm.SubmitError as e:
            typer.echo(f"slurm job {job_id}: state unavailable ({e})")
    st = read_status(RunDir(run_dir))
    typer.echo(f"outcome: {st['state'] if st else 'not finished (no status.json yet)'}")
    if st and st.get("reason"):
        typer.echo(f"reason: {st['reason']}")
    for r in RunDir(run_dir).results():
        typer.echo(f"  {r.name}")


class LogRole(str, Enum):
    prefill = "prefill"
    decode = "decode"
    proxy = "proxy"
    bench = "bench"
    node = "node"


@app.command()
def logs(
    run: RunArg,
    node: Annotated[int | None, typer.Option(help="Only this node's logs, by index [default: every node]")] = None,
    role: Annotated[LogRole | None, typer.Option(help="Only this role's logs [default: every role]")] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines to print from the end of each log (0: all).")] = 50,
    results_dir: ResultsOpt = PROJECT_ROOT / "results",
) -> None:
    """Print the logs of a run, by node and role."""
    from harness.rundir import RunDir

    run_dir = _run_dir(run, results_dir)
    files = RunDir(run_dir).log_files(node, role.value if role else None)
    if not files:
        _fail(f"{run_dir}: no logs for node={node} role={role.value if role else None}", code=1)
    for f in files:
        text = f.read_text(errors="replace").splitlines()
        typer.echo(f"==> {f.relative_to(run_dir)} <==")
        typer.echo("\n".join(text[-lines:] if lines else text))


@app.command()
def cancel(run: RunArg, results_dir: ResultsOpt = PROJECT_ROOT / "results") -> None:
    """Cancel a run's Slurm job (scancel); the job tears every process down on SIGTERM."""
    from harness.launch import slurm

    run_dir = _run_dir(run, results_dir)
    job_id = slurm.job_id_of(run_dir)
    if not job_id:
        _fail(f"{run_dir} has no Slurm job (slurm_job_id is missing)", code=1)
    try:
        slurm.cancel(job_id)
    except slurm.SubmitError as e:
        _fail(str(e), code=1)
    typer.echo(f"cancelled Slurm job {job_id}")


@app.command()
def node(
    run_dir: Annotated[Path, typer.Option("--run-dir", help="The job's run directory.")],
    node_id: Annotated[int | None, typer.Option(help="This node's index in the job [default: $SLURM_NODEID]")] = None,
) -> None:
    """Run this node's part of a job (called by server.sh inside the allocation)."""
    from harness.node.runtime import run_node

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s pdbench-node %(levelname)s %(message)s"
    )
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
    from harness.mock_engine.cli import mock_engine_command
    from harness.node.nic_cli import nic_command
    from harness.proxy.cli import proxy_command
    from harness.report.cli import collect_command, report_command

    app.command("proxy", help="Run the PD proxy (prefill then decode, streamed back).")(proxy_command)
    app.command("bench", help="Benchmark an OpenAI-compatible endpoint over a concurrency sweep.")(bench_command)
    app.command("nic", help="Detect RDMA NICs and print the UCX/NCCL/NIXL environment for this node.")(nic_command)
    app.command("report", help="Compare runs: tables (md/csv/html/json) with baseline deltas, Pareto plot.")(
        report_command
    )
    app.command("collect", help="Write the InferenceX-style aggregate JSON of runs (validated, deduplicated).")(
        collect_command
    )
    app.command("mock-engine", help="Run a mock OpenAI-compatible engine (tests, benchmarks, plumbing checks).")(
        mock_engine_command
    )


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
