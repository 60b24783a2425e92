"""What `pdbench doctor` found: one Finding per problem, naming where (a node, the submit
host, the job) and the cause; the submit host's own checks; the nodes' preflight records."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.config.load import ResolvedRecipe
from harness.rundir import RunDir, log_detail, read_status
from harness.topology import JobPlan

SUBMIT_HOST = "submit host"


@dataclass(frozen=True)
class Finding:
    where: str  # "node 1", or SUBMIT_HOST
    check: str
    cause: str

    def __str__(self) -> str:
        return f"{self.where}: {self.cause}"

    def to_json(self) -> dict[str, str]:
        return {"where": self.where, "check": self.check, "cause": self.cause}


def local_findings(rr: ResolvedRecipe, plan: JobPlan, root: str, here: bool = False) -> list[Finding]:
    """What the submit host can check itself: weights and the shared install, where it sees them
    (everywhere when `here`: the local launcher's nodes are this host)."""
    out: list[Finding] = []
    for cause in model_presence(rr, plan, root, here):
        out.append(Finding(SUBMIT_HOST, "weights", cause))
    site_root = rr.recipe.site.pdbench_root
    if site_root and not (Path(site_root) / "harness" / "__init__.py").is_file():
        out.append(
            Finding(
                SUBMIT_HOST,
                "install",
                f"site.pdbench_root {site_root} holds no pdbench checkout (harness/__init__.py is missing); "
                "the nodes run pdbench from there",
            )
        )
    return out


def model_presence(rr: ResolvedRecipe, plan: JobPlan, root: str, here: bool = False) -> list[str]:
    """The nodes' weights check (the same PreflightSpec), run here when the storage is visible
    from here or the nodes are this host (`here`); otherwise it is left to each node's preflight."""
    from harness.node import preflight as pf
    from harness.render.preflight_spec import preflight_spec

    spec = preflight_spec(rr, plan, root)
    model_root = rr.recipe.site.model_root
    if spec.weights_path:
        # The model root (or the model's parent) visible here means the weights should be too.
        if not here and not (Path(model_root) if model_root else Path(spec.weights_path).parent).is_dir():
            return []
        return pf.check_weights(spec.weights_path, need_weights=spec.need_weights)
    if spec.hf_cache and Path(spec.hf_cache).is_dir():
        return pf.check_weights(None, hf_id=spec.hf_id, hf_cache=spec.hf_cache)
    return []


def node_findings(run_dir: Path, num_nodes: int) -> tuple[list[Finding], list[int]]:
    """The nodes' recorded problems, and the nodes that recorded nothing (never got to check)."""
    out: list[Finding] = []
    silent = []
    for node in range(num_nodes):
        try:
            record = json.loads(RunDir(run_dir).preflight_record(node).read_text())
        except (OSError, ValueError):
            silent.append(node)
            continue
        out += [Finding(f"node {p['node']}", p["check"], p["cause"]) for p in record["problems"]]
    return out, silent


def node_passed(run_dir: Path, num_nodes: int) -> list[tuple[str, list[str]]]:
    """Per node that recorded its preflight, the checks it ran that found no problem."""
    out = []
    for node in range(num_nodes):
        try:
            record = json.loads(RunDir(run_dir).preflight_record(node).read_text())
        except (OSError, ValueError):
            continue
        failed = {p["check"] for p in record["problems"]}
        out.append((f"node {node}", [c for c in record.get("checks", []) if c not in failed]))
    return out


def job_findings(run_dir: Path, num_nodes: int) -> list[Finding]:
    """Every node's problems; a failure recorded before a node could check (its image, its
    container, Slurm) when no node listed a problem."""
    found, silent = node_findings(run_dir, num_nodes)
    status = read_status(RunDir(run_dir))
    if status is not None and status["state"] != "succeeded" and not found:
        failure = status.get("failure") or {}
        where = f"node {failure['node']}" if isinstance(failure.get("node"), int) else "job"
        cause = failure.get("cause") or status.get("reason") or "failed"
        if failure.get("process"):
            cause = f"{failure['process']} ({failure.get('role')}) {cause}"
        cause += log_detail(failure.get("log"), failure.get("log_tail"), failure.get("log_error"))
        found.append(Finding(where, "job", cause))
    elif status is None and not found:
        found.append(Finding("job", "job", f"the check job left no outcome (nodes without a record: {silent})"))
    return found
