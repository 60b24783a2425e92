"""Node 0's accuracy evals around a phase's sweep, while that phase's servers are up.

The settings come from the run directory: recipe.lock.yaml's `accuracy` and `topology`, and the
phase's client config (proxy URL, served name, tokenizer as the nodes see it, the sweep).
Each hook returns the reasons the job fails ([] when none); runtime raises them as a Failure.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import harness
from harness.config.accuracy import AccuracySpec, problems
from harness.evals.command import Endpoint
from harness.evals.data import missing_data
from harness.evals.lm_eval_run import run_eval
from harness.evals.meta_env import EvalJob, Role
from harness.evals.summary import failures
from harness.rundir import RunDir

log = logging.getLogger(__name__)

# Relative include_path and model paths are under the checkout the nodes run.
ROOT = Path(harness.__file__).resolve().parent.parent


def _spec(lock: dict[str, Any]) -> AccuracySpec:
    return AccuracySpec.model_validate(lock["recipe"].get("accuracy") or {})


def _job_phases(lock: dict[str, Any]) -> list[str]:
    topo = lock["recipe"]["topology"]
    if topo.get("aggregated_only"):
        return ["aggregated"]
    return ["disagg", "aggregated"] if topo.get("aggregated") else ["disagg"]


def bound_s(run_dir: Path, phase: str) -> float:
    """How much longer the other nodes wait for the end of `phase`: the bound of each of its evals."""
    lock = RunDir(run_dir).read_lock()
    spec = _spec(lock)
    return spec.timeout_s * len(spec.whens) if phase in spec.evaluated(_job_phases(lock)) else 0.0


def enabled(run_dir: Path) -> bool:
    return _spec(RunDir(run_dir).read_lock()).enabled


def input_problems(run_dir: Path) -> list[str]:
    """What would fail the job's evals for want of their inputs (lm-eval in accuracy.python, task
    directories, cached datasets offline); node 0's preflight, and so `pdbench doctor`, runs it."""
    lock = RunDir(run_dir).read_lock()
    spec = _spec(lock)
    return problems(spec, _job_phases(lock), ROOT) + missing_data(spec)


def before_sweep(run_dir: Path, phase: str) -> list[str]:
    """Missing eval inputs fail the job now, not after the sweep; then the `before` eval, if asked."""
    lock = RunDir(run_dir).read_lock()
    spec = _spec(lock)
    if phase not in spec.evaluated(_job_phases(lock)):
        return []
    bad = problems(spec, _job_phases(lock), ROOT) + missing_data(spec)
    if bad:
        return bad
    return _eval(run_dir, lock, spec, phase, "before") if "before" in spec.whens else []


def after_sweep(run_dir: Path, phase: str) -> list[str]:
    lock = RunDir(run_dir).read_lock()
    spec = _spec(lock)
    return _eval(run_dir, lock, spec, phase, "after") if phase in spec.evaluated(_job_phases(lock)) else []


def _eval(run_dir: Path, lock: dict[str, Any], spec: AccuracySpec, phase: str, when: str) -> list[str]:
    run = RunDir(run_dir)
    bench = json.loads(run.bench_config(phase).read_text())
    topo = lock["recipe"]["topology"]
    prefill, decode = (
        (Role.of(topo["aggregated"]),) * 2
        if phase == "aggregated"
        else (Role.of(topo["prefill"]), Role.of(topo["decode"]))
    )
    shapes = bench.get("shapes") or [{"isl": bench.get("isl") or 0, "osl": bench.get("osl") or 0}]
    job = EvalJob(
        phase=phase,
        when=when,
        concurrency=spec.concurrency_for(bench["concurrency"]),
        model=bench["model"],
        model_prefix=lock["model"]["name"],
        precision=lock["model"]["precision"],
        hw="cpu" if topo["gpus_per_node"] == 0 else "unknown",
        isl=int(shapes[0]["isl"]),
        osl=int(shapes[0]["osl"]),
        fingerprint=lock["fingerprint"],
        prefill=prefill,
        decode=decode,
    )
    tokenizer = bench["tokenizer"]
    if not Path(tokenizer).is_absolute() and (ROOT / tokenizer).exists():
        tokenizer = str(ROOT / tokenizer)
    ep = Endpoint(bench["base_url"], bench["model"], spec.model_type, tokenizer, int(lock["model"]["max_model_len"]))
    log.info("accuracy eval %s %s: %d task(s) at concurrency %d", phase, when, len(spec.tasks), job.concurrency)
    summary = run_eval(spec, ep, job, run.evals(phase, when), ROOT)
    log.info("accuracy eval %s %s: passed %s in %.1f s", phase, when, summary.passed, summary.elapsed_s)
    return failures(summary)
