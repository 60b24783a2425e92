"""Workloads (benchmark.workloads): the client of each workload after the job's own sweep.

Every workload measures the same servers through the same router: its client config holds the
workload's whole benchmark section (the job's, its mapping merged in), the workload's name in the
metadata, and everything it writes under workloads/<name>/ (the run directory's own names, one
level down); the job's logs, state and the proxy's timings stay where they are.
"""

from __future__ import annotations

from typing import Any

from harness.config.load import ResolvedRecipe
from harness.render.commands import Shell, Word, bench_argv, bench_config
from harness.rundir.paths import (
    LOGS,
    PROXY_TIMINGS,
    STATE,
    bench_config_name,
    workload_bench_config_name,
    workload_subdir,
)
from harness.topology import JobPlan

UP = "../../"  # from workloads/<name>/ back to the run directory


def workload_bench_argv(plan: JobPlan, name: str) -> list[Word]:
    """The job's client line, reading the workload's config and writing into the workload's folder."""
    swap = {
        f"${{RUN_DIR}}/{bench_config_name('disagg')}": Shell(f"${{RUN_DIR}}/{workload_bench_config_name(name)}"),
        "${RUN_DIR}": Shell(f"${{RUN_DIR}}/{workload_subdir(name)}"),
    }
    return [swap.get(w.text, w) if isinstance(w, Shell) else w for w in bench_argv(plan, "disagg")]


def workload_bench_config(
    rr: ResolvedRecipe, plan: JobPlan, run_meta: dict[str, Any], name: str, root: str | None = None
) -> dict[str, Any]:
    settings = rr.recipe.benchmark.workload(name)
    cfg = bench_config(rr, plan, run_meta | {"workload": name}, root, settings)
    return cfg | {
        "proxy_timings_dir": UP + PROXY_TIMINGS if cfg["proxy_timings_dir"] else None,
        "server_logs_dir": UP + LOGS,
        "runtime_records_dir": UP + STATE,
    }
