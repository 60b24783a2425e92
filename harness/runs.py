"""Finding run directories and reading what a run left in them (status, logs)."""

from __future__ import annotations

import json
from pathlib import Path


class RunNotFound(Exception):
    pass


def resolve_run(ref: str, results_root: Path) -> Path:
    """A run directory path, or a recipe name (its latest run), or '<recipe>/<run id>'."""
    p = Path(ref)
    if (p / "plan.json").is_file():
        return p.resolve()
    cand = results_root / ref
    if (cand / "plan.json").is_file():
        return cand.resolve()
    if cand.is_dir():
        runs = sorted(d for d in cand.iterdir() if (d / "plan.json").is_file())
        if runs:
            return runs[-1].resolve()
    raise RunNotFound(f"{ref}: no run directory (a path, a recipe name under {results_root}, or recipe/run-id)")


def read_status(run_dir: Path) -> dict | None:
    """status.json; else, for a job whose head node was killed before writing it (Slurm's
    SIGKILL after KillWait), the failure the nodes recorded in state/."""
    p = run_dir / "status.json"
    if p.is_file():
        return json.loads(p.read_text())
    from harness.node.coordination import Coordination
    from harness.rundir import TIME_LIMIT_WARNING

    failure = Coordination(run_dir, "reader", 0).first_failure() if (run_dir / "state").is_dir() else None
    if failure is None:
        return None
    return {
        # As write_status says it: stopped by the warning before the time limit is "timeout".
        "state": "timeout" if failure.cause == TIME_LIMIT_WARNING else "failed",
        "exit_code": None,
        "reason": failure.reason,
        "failure": failure.to_json(),
        "results": sorted(f.name for f in run_dir.glob("concurrency_*.json")),
        "finished_at": None,
    }


def log_files(run_dir: Path, node: int | None = None, role: str | None = None) -> list[Path]:
    """Logs of the run, optionally of one node and/or one role (prefill, decode, proxy, bench, node)."""
    plan = json.loads((run_dir / "plan.json").read_text())
    names: list[str] = []
    for proc in plan["processes"]:
        if node is not None and proc["node"] != node:
            continue
        proc_role = "proxy" if proc["kind"] == "proxy" else proc["name"].split("-")[0]
        if role is None or role == proc_role:
            names.append(proc["name"])
    if role in (None, "bench") and node in (None, plan["proxy_node"]):
        names.append("bench")
    if role in (None, "node"):
        names += [f"node{i}" for i in range(plan["num_nodes"]) if node is None or node == i]
    logs = run_dir / "logs"
    return [logs / f"{n}.log" for n in names if (logs / f"{n}.log").is_file()]
