"""Workloads (benchmark.workloads): the client of each workload after the job's own sweep.

Every workload measures the same servers through the same router: its client config holds the
workload's whole benchmark section (the job's, its mapping merged in), the workload's name in the
metadata, and everything it writes under workloads/<name>/ (the run directory's own names, one
level down); the job's logs, state and the proxy's timings stay where they are.
"""

from __future__ import annotations

from typing import Any

from harness.config.load import ResolvedRecipe
from harness.render.commands import Word, bench_argv_into, bench_config, bench_config_into_subdir
from harness.rundir.paths import (
    workload_bench_config_name,
    workload_subdir,
)
from harness.topology import JobPlan


def workload_bench_argv(plan: JobPlan, name: str) -> list[Word]:
    """The job's client line, reading the workload's config and writing into the workload's folder."""
    return bench_argv_into(plan, workload_bench_config_name(name), workload_subdir(name))


def workload_bench_config(
    rr: ResolvedRecipe, plan: JobPlan, run_meta: dict[str, Any], name: str, root: str | None = None
) -> dict[str, Any]:
    settings = rr.recipe.benchmark.workload(name)
    cfg = bench_config(rr, plan, run_meta | {"workload": name}, root, settings)
    return bench_config_into_subdir(cfg, proxy_timings=bool(cfg["proxy_timings_dir"]))
