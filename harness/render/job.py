"""Render a job into a run directory: its scripts, plan, benchmark configs and recipe lock."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from harness import __version__, atomic, kv_connectors
from harness.config.load import ConfigError, ResolvedRecipe
from harness.render import commands as cmd
from harness.render.arms import arm_bench_argv, arm_bench_config
from harness.render.commands import Shell, Word, quote
from harness.render.preflight_spec import preflight_spec
from harness.render.vllm_router import router_argv
from harness.render.workloads import workload_bench_argv, workload_bench_config
from harness.rundir import TIME_LIMIT_WARNING, RunDir
from harness.rundir.paths import IMAGE_RECORD_JOB, SLURM_OUTPUT, image_record_name, script_names
from harness.topology import JobPlan, PlanFile, arm_bench_name, bench_name, plan, workload_bench_name

TEMPLATES = Path(__file__).resolve().parents[2] / "slurm_templates"
# The job script reads the image file once for its sha256 (enroot, apptainer), before any
# server starts; a 30 GB image at 100 MB/s fits.
IMAGE_HASH_TIMEOUT_S = 600


@dataclass(frozen=True)
class RenderContext:
    """Where the job will find things; fixed values in golden tests, real ones otherwise."""

    run_dir: str
    root: str
    python: str
    git_commit: str | None
    resumed_from: str | None = None  # submit --resume: the run whose finished points this one keeps


def current_context(run_dir: Path, root: Path, rr: ResolvedRecipe | None = None) -> RenderContext:
    """This checkout and Python, or the shared install the recipe's site names (site.pdbench_root)."""
    site = rr.recipe.site if rr is not None else None
    if site is not None and site.pdbench_root:
        python = site.python or f"{site.pdbench_root}/.venv/bin/python"
        return RenderContext(str(run_dir.resolve()), site.pdbench_root, python, git_commit(Path(site.pdbench_root)))
    python = site.python if site is not None and site.python else sys.executable
    return RenderContext(str(run_dir.resolve()), str(root.resolve()), python, git_commit(root))


#: A tree shipped without its .git (scripts/device/snapshot.sh's `git archive`) names its commit here.
COMMIT_FILE = ".pdbench-commit"
_COMMIT = re.compile(r"[0-9a-f]{40}")


def git_commit(root: Path) -> str | None:
    """The commit the project at `root` runs: git's HEAD, else the commit its COMMIT_FILE names."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        named = (root / COMMIT_FILE).read_text().strip()
    except OSError:
        return None
    return named if _COMMIT.fullmatch(named) else None


def _argv_lines(argv: list[Word], indent: int) -> str:
    """One flag (with its values) per line, so a rendered command reads and diffs well."""
    lines: list[list[str]] = [[]]
    for word in argv:
        if isinstance(word, str) and word.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(quote(word))
    return (" \\\n" + " " * indent).join(" ".join(line) for line in lines)


# sbatch reads `#SBATCH` lines with shell-like quotes, but a newline ends the line and a
# backslash escapes even inside quotes; the schema keeps both out of recipe values.
_SBATCH_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")


def sbatch_quote(value: str) -> str:
    """An `#SBATCH --flag=VALUE` value, quoted as submitit's `_as_sbatch_flag` quotes it."""
    if _SBATCH_UNSAFE.search(value):
        # Only a run directory path gets here unchecked (recipe values are checked at load).
        raise ConfigError(value, "", "an #SBATCH line cannot carry control characters or '\\'")
    return shlex.quote(value)


def sbatch_option(opt: str) -> str:
    """'--name=value' from slurm.extra_sbatch, its value quoted; '--name' as is."""
    flag, eq, value = opt.partition("=")
    return f"{flag}={sbatch_quote(value)}" if eq else flag


def _env(env: dict[str, Word]) -> list[tuple[str, str]]:
    return [(k, quote(v)) for k, v in env.items()]


@functools.cache  # compiling the templates costs more than rendering them
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["q"] = quote
    env.filters["sbatch_q"] = sbatch_quote
    env.filters["argv_lines"] = _argv_lines
    return env


def _procs(rr: ResolvedRecipe, p: JobPlan, root: str) -> list[dict[str, Any]]:
    workers = {w.name: w for w in p.workers}
    procs = []
    for proc in p.processes():
        if proc.kind == "proxy":
            what = "PD proxy" if proc.phase == "disagg" else "proxy of the aggregated baseline"
            router = (proc.arm or rr.recipe.proxy.kind) == "vllm-router"
            if router:
                what = f"vllm-router as the {what}"
            if proc.arm is not None:
                what = (
                    f"router arm {proc.arm} ({'vllm-router' if router else 'the PD proxy'}), after the job's own router"
                )
            procs.append(
                {
                    "name": proc.name,
                    "func": proc.name.replace("-", "_"),
                    "summary": f"{what} on node {p.proxy_node}, port {proc.port}",
                    "env": [],
                    "argv": router_argv(rr, p, proc.phase) if router else cmd.proxy_argv(rr, p, proc.phase),
                    "nic": False,
                }
            )
            continue
        assert proc.worker is not None  # every non-proxy process belongs to a worker
        w = workers[proc.worker]
        rank = w.nodes.index(proc.node)
        what = (
            f"{w.role} worker {w.index} on node {proc.node}, port {w.port}, {w.devices} device(s)"
            if rank == 0
            else f"headless follower {rank} of {w.name} on node {proc.node} ({w.span.replace('_', ' ')})"
        )
        procs.append(
            {
                "name": proc.name,
                "func": proc.name.replace("-", "_"),
                "summary": what,
                "nic": rr.recipe.topology.nic_detection,
                "env": _env(cmd.server_env(rr, w)),
                "argv": cmd.server_argv(rr, w, root, rank),
            }
        )
    clients = [
        (
            bench_name(phase),
            "the proxy" if phase == "disagg" else "the aggregated baseline's proxy",
            cmd.bench_argv(p, phase),
        )
        for phase in p.phases
    ]
    clients += [(arm_bench_name(arm), f"router arm {arm}", arm_bench_argv(p, arm)) for arm in p.arms]
    clients += [
        (workload_bench_name(w), f"the proxy, workload {w} (benchmark.workloads)", workload_bench_argv(p, w))
        for w in p.workloads
    ]
    for name, target, argv in clients:
        procs.append(
            {
                "name": name,
                "func": name.replace("-", "_"),
                "summary": f"benchmark client on node {p.proxy_node}, through {target}",
                # The tokenizer cache in the results root (RUN_DIR is <root>/<recipe>/<run>), on
                # the results' storage: a later job on any node skips building it
                # (harness.bench.tokenizer); a hidden directory, so no tool takes it for a run.
                "env": _env({"PDBENCH_CACHE_DIR": Shell("${RUN_DIR}/../../.cache")}),
                "argv": argv,
                "nic": False,
            }
        )
    return procs


def _sbatch_opts(rr: ResolvedRecipe) -> list[str]:
    s = rr.recipe.slurm
    opts = [
        f"--{flag}={sbatch_quote(value)}"
        for flag, value in (
            ("partition", s.partition),
            ("account", s.account),
            ("qos", s.qos),
            ("nodelist", s.nodelist),
            ("exclude", s.exclude),
            ("reservation", s.reservation),
            ("constraint", s.constraint),
        )
        if value
    ]
    gpn = rr.recipe.topology.gpus_per_node
    if gpn and s.gpu_request == "gpus-per-node":
        opts.append(f"--gpus-per-node={gpn}")
    elif gpn and s.gpu_request == "gres":
        opts.append(f"--gres={sbatch_quote(f'{s.gres_name}:{gpn}')}")
    return opts + [sbatch_option(o) for o in s.extra_sbatch]


def topology_summary(rr: ResolvedRecipe) -> str:
    t = rr.recipe.topology
    parts = []
    for role in ("prefill", "decode"):
        r = getattr(t, role)
        parts.append(
            f"{r.workers}x {role} on {r.nodes} node(s) (tp{r.tp} dp{r.dp} ep{r.ep}"
            f"{' dp-attn' if r.dp_attention else ''})"
        )
    return f"{' + '.join(parts)}, connector {rr.recipe.connector.name}"


def run_metadata(rr: ResolvedRecipe, p: JobPlan, ctx: RenderContext) -> dict[str, Any]:
    """The metadata block every result file carries."""
    t, c = rr.recipe.topology, rr.recipe.connector
    meta: dict[str, Any] = {
        "recipe": rr.name,
        "recipe_fingerprint": rr.fingerprint,
        "pdbench_version": __version__,
        "pdbench_commit": ctx.git_commit,
        "model": rr.recipe.model,
        "model_source": rr.model.hf_id or rr.model.path,
        "precision": rr.model.precision,
        "image": rr.recipe.container.image,
        "container_runtime": rr.recipe.container.runtime,
        "connector": c.name,
        "kv_buffer_device": c.kv_buffer_device,
        "proxy": rr.recipe.proxy.kind,
        **({"arm": rr.recipe.proxy.kind} if rr.recipe.proxy.arms else {}),
        "disagg": True,
        "num_nodes": p.num_nodes,
        "gpus_per_node": t.gpus_per_node,
    }
    if ctx.resumed_from:
        meta["resumed_from"] = ctx.resumed_from
    for role in ("prefill", "decode"):
        r = getattr(t, role)
        meta.update(
            {
                f"{role}_num_workers": r.workers,
                f"{role}_nodes": r.nodes,
                f"{role}_tp": r.tp,
                f"{role}_dp": r.dp,
                f"{role}_ep": r.ep,
                f"{role}_dp_attention": r.dp_attention,
                f"{role}_gpus": p.devices(role),
            }
        )
    return meta


def aggregated_run_metadata(rr: ResolvedRecipe, p: JobPlan, ctx: RenderContext) -> dict[str, Any]:
    """The metadata of the baseline's results: the job's, as one aggregated deployment (the
    fields InferenceX's single-node results carry: tp, ep, dp_attention, GPUs)."""
    a = rr.recipe.topology.aggregated
    assert a is not None
    meta = {k: v for k, v in run_metadata(rr, p, ctx).items() if not k.startswith(("prefill_", "decode_"))}
    return meta | {
        "disagg": False,
        "framework": "vllm",  # InferenceX's name for aggregated vLLM (vllm-disagg is the default)
        "baseline_of": "disagg",
        "connector": None,
        "kv_buffer_device": None,
        "num_workers": a.workers,
        "nodes": a.nodes,
        "tp": a.tp,
        "dp": a.dp,
        "ep": a.ep,
        "dp_attention": a.dp_attention,
        "gpus": p.devices("aggregated"),
    }


def render_job(rr: ResolvedRecipe, out_dir: Path, ctx: RenderContext, job_plan: JobPlan | None = None) -> JobPlan:
    """Write every file of the job into out_dir (which must exist); `job_plan` is plan(rr) when the
    caller computed it already."""
    p = job_plan if job_plan is not None else plan(rr)
    env = _environment()
    common = {"name": rr.name, "fingerprint": rr.fingerprint, "version": __version__, "names": script_names()}
    # What every node's Python must import before anything starts: pdbench's node, and
    # vllm-router where it is the job's router (a missing package fails the node at once).
    node_modules = [
        "harness.node.runtime",
        *(["vllm_router.launch_router"] if "vllm-router" in (rr.recipe.proxy.kind, *rr.recipe.proxy.arms) else []),
    ]
    server = env.get_template("server.sh.j2").render(
        **common,
        procs=_procs(rr, p, ctx.root),
        job_env=_env({**cmd.storage_env(rr), **rr.recipe.env}),
        node_import="import " + ", ".join(node_modules),
    )
    # The weights and the HF cache, read-only at the same paths, unless the recipe mounts them itself.
    mounts = sorted({**cmd.storage_mounts(rr, ctx.root), **rr.recipe.container.mounts}.items())
    job = env.get_template("job.slurm.j2").render(
        **common,
        # One comment line per line: a newline in the description never starts a command.
        description=(rr.recipe.description or rr.name).split("\n"),
        topology_summary=topology_summary(rr),
        num_nodes=p.num_nodes,
        slurm=rr.recipe.slurm,
        # '%' starts a Slurm file-name pattern; '%%' is a literal one.
        slurm_out=ctx.run_dir.replace("%", "%%") + f"/{SLURM_OUTPUT}",
        sbatch_opts=_sbatch_opts(rr),
        run_dir=ctx.run_dir,
        root=ctx.root,
        python=ctx.python,
        runtime=rr.recipe.container.runtime,
        image=rr.recipe.container.image or "",
        mounts=mounts,
        mount_list="".join(f",{src}:{dst}" for src, dst in mounts),
        secrets=rr.recipe.secrets,
        image_record=IMAGE_RECORD_JOB,
        image_hash_timeout_s=IMAGE_HASH_TIMEOUT_S,
    )
    container = None
    if rr.recipe.container.runtime in ("docker", "podman"):
        c = rr.recipe.container
        container = env.get_template("container.sh.j2").render(
            **common,
            runtime=c.runtime,
            image=c.image or "",
            gpus=c.gpus,
            privileged=c.privileged,
            pull_timeout_s=c.pull_timeout_s,
            mounts=mounts,
            secrets=rr.recipe.secrets,
            setup=c.setup,
            image_record=image_record_name("$NODE"),
            time_limit_warning=TIME_LIMIT_WARNING,
            probe_modules=[
                "harness.node.runtime",
                "harness.proxy.server",
                "harness.bench.client",
                # What the connector needs importable in the image besides vLLM.
                *kv_connectors.get_kv(rr.recipe.connector.name).image_modules,
                # proxy.kind vllm-router runs in the image's Python too.
                *(
                    ["vllm_router.launch_router"]
                    if "vllm-router" in (rr.recipe.proxy.kind, *rr.recipe.proxy.arms)
                    else []
                ),
            ],
            # What the set-up steps' cache is keyed by, besides the base image's id.
            setup_digest=hashlib.sha256(
                json.dumps([s.model_dump() for s in c.setup], sort_keys=True).encode()
            ).hexdigest()[:16],
        )
    lock = {
        **rr.locked(),
        "fingerprint": rr.fingerprint,
        "pdbench_version": __version__,
        "git_commit": ctx.git_commit,
        "cluster_profile": str(rr.cluster_file) if rr.cluster_file else None,
        # Where each value came from: the recipe, the cluster profile, a --set, or the default.
        "sources": rr.sources(),
    }
    if ctx.resumed_from:
        lock["resumed_from"] = ctx.resumed_from
    bench = cmd.bench_config(rr, p, run_metadata(rr, p, ctx), ctx.root)
    if ctx.resumed_from:
        bench["resume"] = True  # keep the finished points copied from that run
    plan_json = PlanFile.of(rr, p, preflight_spec(rr, p, ctx.root)).to_json()
    run = RunDir(out_dir)
    files = {
        run.server_script: server,
        run.job_script: job,
        run.lock: yaml.safe_dump(lock, sort_keys=False),
        run.plan: json.dumps(plan_json, indent=2) + "\n",
    }
    if "disagg" in p.phases:
        files[run.bench_config("disagg")] = json.dumps(bench, indent=2) + "\n"
    for arm in p.arms:
        cfg = arm_bench_config(rr, p, run_metadata(rr, p, ctx), arm, ctx.root)
        files[run.arm_bench_config(arm)] = (
            json.dumps(cfg | {"resume": True} if ctx.resumed_from else cfg, indent=2) + "\n"
        )
    for workload in p.workloads:  # a resume of a job with workloads is refused (harness.resume_run)
        cfg = workload_bench_config(rr, p, run_metadata(rr, p, ctx), workload, ctx.root)
        files[run.workload_bench_config(workload)] = json.dumps(cfg, indent=2) + "\n"
    if "aggregated" in p.phases:
        agg = cmd.aggregated_bench_config(rr, p, aggregated_run_metadata(rr, p, ctx), ctx.root)
        if ctx.resumed_from:
            agg["resume"] = True
        files[run.bench_config("aggregated")] = json.dumps(agg, indent=2) + "\n"
    if container is not None:
        files[run.container_script] = container
    scripts = (run.server_script, run.job_script, run.container_script)
    for path, text in files.items():
        write_new(path, text, executable=path in scripts)
    return p


def write_new(path: Path, text: str, executable: bool = False) -> None:
    """Write atomically and never replace an existing file."""
    try:
        atomic.write_text(path, text, replace=False, mode=0o755 if executable else 0o644)
    except FileExistsError:
        raise FileExistsError(f"{path} already exists; pdbench never overwrites a run's files") from None
