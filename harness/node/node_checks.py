"""The preflight of one node: which checks of harness.node.preflight apply, run them, record them.

Every node runs this before it starts any server (a job on a real cluster would otherwise
find a taken port or a missing file 10-20 minutes into loading a model), and `pdbench
doctor` runs a job that does only this. Each node writes its record to
RunDir.preflight_record(node).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from harness import atomic
from harness.node import accuracy_step
from harness.node import preflight as pf
from harness.rundir import RunDir
from harness.topology import PlanFile

log = logging.getLogger(__name__)

PREFLIGHT_TIMEOUT_S = 20.0


def checks_for(plan: PlanFile, node: int, run_dir: Path) -> dict[str, Callable[[], list[str]]]:
    spec = plan.preflight
    checks: dict[str, Callable[[], list[str]]] = {
        "ports": lambda: pf.check_ports(spec.ports.get(node, [])),
        # Logs and result files; a full disk loses them silently.
        "disk": lambda: pf.check_disk(str(run_dir), 1 << 30),
        "clock": lambda: pf.check_clock(run_dir),
    }
    if spec.weights_path or spec.hf_id:
        checks["weights"] = lambda: pf.check_weights(
            spec.weights_path, hf_id=spec.hf_id, hf_cache=spec.hf_cache, need_weights=spec.need_weights
        )
    if spec.gpus.get(node):
        checks["gpus"] = lambda: pf.check_gpus(spec.gpus[node], env=os.environ)
    if spec.memory_bytes.get(node):
        checks["memory"] = lambda: pf.check_memory(spec.memory_bytes[node])
    if spec.rdma:
        checks["rdma"] = lambda: pf.check_rdma(environ=os.environ)
    if node in spec.nsys_nodes:
        checks["nsys"] = lambda: pf.check_nsys(env=os.environ)
    # The evals run on node 0 (the proxy's) after the sweep: their inputs are checked before it.
    if node == plan.proxy_node and accuracy_step.enabled(run_dir):
        checks["accuracy"] = lambda: accuracy_step.input_problems(run_dir)
    return checks


def run_preflight(plan: PlanFile, node: int, run_dir: Path) -> list[pf.Problem]:
    """Run this node's checks (bounded) and record them; returns the problems found."""
    start = time.monotonic()
    checks = checks_for(plan, node, run_dir)
    problems = pf.run_checks(node, checks, timeout_s=PREFLIGHT_TIMEOUT_S)
    if not problems:
        log.info("preflight passed: %s", ", ".join(checks))
    atomic.write_json(
        RunDir(run_dir).preflight_record(node),
        {
            "node": node,
            "checks": list(checks),
            "problems": [{"node": p.node, "check": p.check, "cause": p.cause} for p in problems],
            "seconds": round(time.monotonic() - start, 3),
        },
        indent=2,
    )
    return problems


def describe(problems: list[pf.Problem]) -> str:
    """A node's failure cause: one line per problem (the failure names the node)."""
    head = f"preflight found {len(problems)} problem(s)"
    return head + ":\n" + "\n".join(f"  {p.cause}" for p in problems)


def is_doctor_run(run_dir: Path) -> bool:
    return RunDir(run_dir).doctor_marker.is_file()
