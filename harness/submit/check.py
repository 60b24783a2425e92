"""The check stage: the recipe loaded and planned once, then checked before anything is rendered."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.config.bounds import check_lengths
from harness.config.cluster import chosen_profile
from harness.config.executor import check_executor
from harness.config.hardware import check_hardware
from harness.config.load import PROJECT_ROOT, ConfigError, ResolvedRecipe, load_recipe
from harness.config.overrides import Overrides
from harness.config.recipe_names import check_recipe_name
from harness.doctor.findings import local_findings
from harness.launch.launcher import Launcher
from harness.launch.local import LocalLauncher
from harness.launch.slurm import SlurmLauncher
from harness.submit.refused import Refused
from harness.topology import JobPlan, plan


def note(message: str) -> None:
    """A remark for the user on stderr (stdout may be --json)."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Planned:
    rr: ResolvedRecipe
    plan: JobPlan
    here: bool = False  # the nodes are this host (the local launcher): check their files here


def load(recipe: str, overrides: Overrides | None, cluster: str | None = None) -> ResolvedRecipe:
    try:
        return load_recipe(recipe, overrides or (), cluster=chosen_profile(cluster))
    except ConfigError as e:
        raise Refused(str(e)) from None


def planned(rr: ResolvedRecipe, launcher: Launcher | None = None) -> Planned:
    """The recipe's plan, computed once for every later stage; the launcher checks it can run it."""
    try:
        check_hardware(rr)
        check_lengths(rr)
        job_plan = plan(rr, single_host=launcher is not None and launcher.single_host)
        check_executor(rr, {w.role for w in job_plan.workers})
        if launcher is not None:
            launcher.check(rr, job_plan)
    except ConfigError as e:
        raise Refused(str(e)) from None
    return Planned(rr, job_plan, here=isinstance(launcher, LocalLauncher))


def launcher_for(kind: str, rr: ResolvedRecipe) -> Launcher:
    """`--launcher`'s value as the launcher of a benchmark job."""
    if kind == "local":
        t = rr.recipe.timeouts
        return LocalLauncher(t.job_s, t.teardown_s)
    return SlurmLauncher()


def ensure_model(rr: ResolvedRecipe) -> None:
    """Build a model the catalogue knows how to make offline (the tiny model) when it is missing."""
    if rr.model.build == "tiny-llama" and rr.model.path is not None:
        path = Path(rr.model_source)
        if not (path / "config.json").is_file():
            from harness import tiny_model

            note(f"building the tiny model in {path}")
            tiny_model.build(path)


def flag_problems(p: Planned) -> list[str] | None:
    """The job's `vllm serve` lines through vLLM's own parser, where vLLM is importable here;
    None when it is not (nothing was checked)."""
    from harness.render import vllm_flags
    from harness.render.commands import serve_lines

    lines = serve_lines(p.rr, p.plan)
    try:
        # vLLM logs to stdout as it imports; stdout is for pdbench's own output (--json).
        with contextlib.redirect_stdout(sys.stderr):
            problems = vllm_flags.check_many(
                [argv for _, argv, _ in lines],
                [origins for _, _, origins in lines],
                cache_dir=PROJECT_ROOT / ".cache" / "vllm-flag-check",
            )
    except vllm_flags.VllmUnavailable:
        return None
    version_note = vllm_flags.image_version_note(p.rr.recipe.container.image, vllm_flags.vllm_version())
    if version_note:
        note(f"note: {version_note}")
    return [f"vLLM rejects a flag: {problem}" for problem in problems]


def router_problems(p: Planned) -> list[str]:
    """proxy.kind (or a router arm of proxy.arms) vllm-router: each of its command lines through
    vllm-router's own parser, where the package is importable here (else a note: the node's check
    finds it missing). As an arm it serves the disaggregated servers only (validate's rule)."""
    if "vllm-router" not in (p.rr.recipe.proxy.kind, *p.rr.recipe.proxy.arms):
        return []
    from harness.render import vllm_router

    problems = []
    try:
        for phase in p.plan.phases:
            problems += [
                f"vllm-router rejects its {phase} line: {e}"
                for e in vllm_router.check_argv(vllm_router.router_argv(p.rr, p.plan, phase))
            ]
    except vllm_router.RouterUnavailable as e:
        note(f"note: proxy.kind vllm-router: its arguments were not checked: {e}")
    return problems


def check_flags(p: Planned, skip: bool) -> None:
    # The router's parser is cheap and has nothing to do with vLLM's: skip only vLLM's.
    problems = ([] if skip else flag_problems(p) or []) + router_problems(p)
    if problems:
        raise Refused("\n".join(problems))


def unset_secrets(rr: ResolvedRecipe) -> list[str]:
    """The recipe's secrets that the submitting environment does not set: the job would start
    without them (and fail, e.g. at a gated model's download)."""
    return [name for name in rr.recipe.secrets if name not in os.environ]


def check_secrets(rr: ResolvedRecipe, dry_run: bool) -> None:
    """Refuse a submit whose secrets are not set here; a dry run or validate only says so."""
    if missing := unset_secrets(rr):
        what = f"secrets: {', '.join(missing)} not set in this environment; the job takes them from it at run time"
        if not dry_run:
            raise Refused(f"{rr.blame('secrets')}: {what} (export them, then submit)")
        note(f"note: {what}")


def check_storage(p: Planned) -> None:
    """Weights and the shared install, checked here when this host sees them (else on every node)."""
    ensure_model(p.rr)
    findings = local_findings(p.rr, p.plan, str(p.rr.root), here=p.here)
    if findings:
        raise Refused("\n".join(str(f) for f in findings))


def _buildable(rr: ResolvedRecipe) -> bool:
    """A model that submit builds offline when it is missing (ensure_model)."""
    return rr.model.build is not None and not (Path(rr.model_source) / "config.json").is_file()


def validate(
    recipe: str, overrides: Overrides | None, cluster: str | None, skip_flag_check: bool, launcher_kind: str = "slurm"
) -> str:
    """`pdbench validate`: what submit checks before it creates a run directory, for this
    launcher, without writing anything; then the cluster profile and what it set, and notes."""
    rr = load(recipe, overrides, cluster)
    try:
        check_recipe_name(rr)  # validate only: what a new recipe in recipes/ is checked with
    except ConfigError as e:
        raise Refused(str(e)) from None
    p = planned(rr, launcher_for(launcher_kind, rr))
    check_flags(p, skip_flag_check)
    check_secrets(rr, dry_run=True)
    findings = [
        f for f in local_findings(rr, p.plan, str(rr.root), here=p.here) if f.check != "weights" or not _buildable(rr)
    ]
    if findings:
        raise Refused("\n".join(str(f) for f in findings))
    topo = rr.recipe.topology
    if topo.aggregated_only and topo.aggregated is not None:  # no prefill, decode or KV connector runs
        serving = f"{topo.aggregated.workers} aggregated instance(s) on {p.plan.num_nodes} node(s)"
    else:
        serving = (
            f"{topo.prefill.workers}P+{topo.decode.workers}D on {p.plan.num_nodes} node(s), "
            f"connector {rr.recipe.connector.name}"
        )
    lines = [
        f"ok: {rr.name} ({rr.recipe_file}): model {rr.recipe.model}, {serving}, "
        f"launcher {launcher_kind}, fingerprint {rr.fingerprint}"
    ]
    return "\n".join(lines + profile_lines(rr) + storage_notes(p))


def profile_lines(rr: ResolvedRecipe) -> list[str]:
    """The cluster profile used and each value it set, with the recipe's value it replaced."""
    if rr.cluster_file is None:
        return ["cluster profile: none (--cluster or $PDBENCH_CLUSTER names one)"]
    own = rr.file_values()
    lines = [f"cluster profile: {rr.cluster_file}, which sets:"]
    for key, value in rr.profile_values().items():
        was = f" (the recipe's: {own[key]})" if key in own and own[key] != value else ""
        lines.append(f"  {key} = {value}{was}")
    return lines


def storage_notes(p: Planned) -> list[str]:
    """What the job would fetch at start-up for want of site storage."""
    from harness.render.preflight_spec import preflight_spec

    rr = p.rr
    if rr.weights_local:
        return []
    nodes = "every node" if p.plan.num_nodes > 1 else "the node"
    # --load-format dummy: only the config and the tokenizer.
    what = rr.model.hf_id if preflight_spec(rr, p.plan, str(rr.root)).need_weights else f"{rr.model.hf_id}'s config"
    return [
        f"note: {nodes} would download {what} from the Hugging Face hub at start-up: no "
        "site.model_root or site.hf_cache is set (a cluster profile's site section, --cluster, says where "
        "the cluster keeps weights)"
    ]
