"""The check stage: the recipe loaded and planned once, then checked before anything is rendered."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.config.cluster import chosen_profile
from harness.config.load import PROJECT_ROOT, ConfigError, ResolvedRecipe, load_recipe
from harness.doctor.findings import local_findings
from harness.launch.launcher import Launcher
from harness.submit.refused import Refused
from harness.topology import JobPlan, plan


def note(message: str) -> None:
    """A remark for the user on stderr (stdout may be --json)."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Planned:
    rr: ResolvedRecipe
    plan: JobPlan


def load(recipe: str, overrides: list[str] | None, cluster: str | None = None) -> ResolvedRecipe:
    try:
        return load_recipe(recipe, overrides or [], cluster=chosen_profile(cluster))
    except ConfigError as e:
        raise Refused(str(e)) from None


def planned(rr: ResolvedRecipe, launcher: Launcher | None = None) -> Planned:
    """The recipe's plan, computed once for every later stage; the launcher checks it can run it."""
    try:
        job_plan = plan(rr)
        if launcher is not None:
            launcher.check(rr, job_plan)
    except ConfigError as e:
        raise Refused(str(e)) from None
    return Planned(rr, job_plan)


def ensure_model(rr: ResolvedRecipe) -> None:
    """Build a model the catalogue knows how to make offline (the tiny model) when it is missing."""
    if rr.model.build == "tiny-llama" and rr.model.path is not None:
        path = Path(rr.model_source)
        if not (path / "config.json").is_file():
            from harness import tiny_model

            note(f"building the tiny model in {path}")
            tiny_model.build(path)


def flag_problems(p: Planned) -> list[str]:
    """The job's `vllm serve` lines through vLLM's own parser, where vLLM is importable here."""
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
        return []
    version_note = vllm_flags.image_version_note(p.rr.recipe.container.image, vllm_flags.vllm_version())
    if version_note:
        note(f"note: {version_note}")
    return [f"vLLM rejects a flag: {problem}" for problem in problems]


def check_flags(p: Planned, skip: bool) -> None:
    if skip:
        return
    problems = flag_problems(p)
    if problems:
        raise Refused("\n".join(problems))


def check_storage(p: Planned) -> None:
    """Weights and the shared install, checked here when this host sees them (else on every node)."""
    ensure_model(p.rr)
    findings = local_findings(p.rr, p.plan, str(p.rr.root))
    if findings:
        raise Refused("\n".join(str(f) for f in findings))


# Command-line Slurm options and the recipe keys they set.
SLURM_KEYS = {
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


def slurm_overrides(sbatch: list[str] | None = None, **opts: object) -> list[str]:
    """Command-line Slurm options become ordinary recipe overrides, so the lock file records them."""
    out = [
        f"{SLURM_KEYS[k]}={json.dumps(v) if isinstance(v, str) else v}"
        for k, v in opts.items()
        if k in SLURM_KEYS and v is not None
    ]
    if sbatch:
        out.append(f"slurm.extra_sbatch={json.dumps(list(sbatch))}")
    return out
