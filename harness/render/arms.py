"""Router arms (proxy.arms): the client of each arm after the job's own router.

Every arm measures the same servers with the same settings and seed (so the same prompts): its
client config is the job's, with the arm's router in the metadata and everything it writes under
arms/<arm>/ (the run directory's own names, one level down); the job's logs and state stay where
they are. Only pdbench's proxy writes per-request timings.
"""

from __future__ import annotations

from typing import Any

from harness.config.load import ResolvedRecipe
from harness.render.commands import Word, bench_argv_into, bench_config, bench_config_into_subdir
from harness.rundir.paths import arm_bench_config_name, arm_subdir
from harness.topology import JobPlan


def arm_bench_argv(plan: JobPlan, arm: str) -> list[Word]:
    """The job's client line, reading the arm's config and writing into the arm's folder."""
    return bench_argv_into(plan, arm_bench_config_name(arm), arm_subdir(arm))


def arm_bench_config(
    rr: ResolvedRecipe, plan: JobPlan, run_meta: dict[str, Any], arm: str, root: str | None = None
) -> dict[str, Any]:
    cfg = bench_config(rr, plan, run_meta | {"proxy": arm, "arm": arm}, root)
    return bench_config_into_subdir(cfg, proxy_timings=arm == "pdbench")
