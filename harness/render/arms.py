"""Router arms (proxy.arms): the client of each arm after the job's own router.

Every arm measures the same servers with the same settings and seed (so the same prompts): its
client config is the job's, with the arm's router in the metadata and everything it writes under
arms/<arm>/ (the run directory's own names, one level down); the job's logs and state stay where
they are. Only pdbench's proxy writes per-request timings.
"""

from __future__ import annotations

from typing import Any

from harness.config.load import ResolvedRecipe
from harness.render.commands import Shell, Word, bench_argv, bench_config
from harness.rundir.paths import LOGS, PROXY_TIMINGS, STATE, arm_bench_config_name, arm_subdir, bench_config_name
from harness.topology import JobPlan

UP = "../../"  # from arms/<arm>/ back to the run directory


def arm_bench_argv(plan: JobPlan, arm: str) -> list[Word]:
    """The job's client line, reading the arm's config and writing into the arm's folder."""
    swap = {
        f"${{RUN_DIR}}/{bench_config_name('disagg')}": Shell(f"${{RUN_DIR}}/{arm_bench_config_name(arm)}"),
        "${RUN_DIR}": Shell(f"${{RUN_DIR}}/{arm_subdir(arm)}"),
    }
    return [swap.get(w.text, w) if isinstance(w, Shell) else w for w in bench_argv(plan, "disagg")]


def arm_bench_config(
    rr: ResolvedRecipe, plan: JobPlan, run_meta: dict[str, Any], arm: str, root: str | None = None
) -> dict[str, Any]:
    cfg = bench_config(rr, plan, run_meta | {"proxy": arm, "arm": arm}, root)
    return cfg | {
        "proxy_timings_dir": UP + PROXY_TIMINGS if arm == "pdbench" else None,
        "server_logs_dir": UP + LOGS,
        "runtime_records_dir": UP + STATE,
    }
