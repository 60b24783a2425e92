"""Run one eval (every task of a phase at one time) against a proxy and write its artifacts.

Layout under RunDir.evals(phase, when), one lm-eval invocation per task (each its own
num_fewshot and limit):
  <task>/results_<time>.json, <task>/samples_<task>_<time>.jsonl   lm-eval's files, moved flat
  <task>/meta_env.json                                             as InferenceX stages them
  <task>/lm-eval.log                                               lm-eval's output
  pdbench-accuracy.json                                            pdbench's verdict (ACCURACY_SUMMARY)
InferenceX's utils/collect_eval_results.py, given the eval's directory, finds each <task>/.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from harness.atomic import write_json
from harness.config.accuracy import AccuracySpec, AccuracyTask
from harness.config.checkout import in_checkout
from harness.evals import interpreter
from harness.evals.command import Endpoint, lm_eval_argv
from harness.evals.meta_env import EvalJob, meta_env
from harness.evals.summary import score_task, write
from harness.rundir.accuracy_summary import AccuracySummary, TaskScore
from harness.rundir.paths import ACCURACY_SUMMARY

META_ENV = "meta_env.json"
LM_EVAL_LOG = "lm-eval.log"
RAW = "lm-eval-output"  # lm-eval's --output_path; its files are moved up into the task's directory


def lm_eval_version(spec: AccuracySpec, env: dict[str, str] | None = None) -> str:
    """As accuracy.python says (in a subprocess); the eval's own run says why when it cannot."""
    try:
        return interpreter.version(spec, env)
    except interpreter.LmEvalMissing:
        return "not installed"
    except interpreter.LmEvalUnavailable:
        return "unknown"


def run_eval(
    spec: AccuracySpec,
    ep: Endpoint,
    job: EvalJob,
    out_dir: Path,
    root: Path,
    env: dict[str, str] | None = None,
) -> AccuracySummary:
    """Every task of `spec` in turn, bounded together by spec.timeout_s; writes the summary."""
    start = time.monotonic()
    deadline = start + spec.timeout_s
    version = lm_eval_version(spec, env)
    scores: list[TaskScore] = []
    errors: list[str] = []
    for task in spec.tasks:
        results, error = _run_task(spec, task, ep, job, out_dir / task.name, root, env, deadline - time.monotonic())
        scores.append(score_task(task, results))
        if error is not None:
            errors.append(f"task {task.name}: {error}")
    summary = AccuracySummary(
        phase=job.phase,
        when=job.when,
        concurrency=job.concurrency,
        lm_eval_version=version,
        base_url=ep.url,
        elapsed_s=round(time.monotonic() - start, 3),
        tasks=tuple(scores),
        error="; ".join(errors) or None,
    )
    write(summary, out_dir / ACCURACY_SUMMARY)
    return summary


def _run_task(
    spec: AccuracySpec,
    task: AccuracyTask,
    ep: Endpoint,
    job: EvalJob,
    task_dir: Path,
    root: Path,
    env: dict[str, str] | None,
    budget_s: float,
) -> tuple[dict[str, Any] | None, str | None]:
    """lm-eval's results of one task (None when it wrote none) and what went wrong, if anything."""
    if budget_s <= 0:
        return None, f"not run: the eval's {spec.timeout_s:.0f} s (accuracy.timeout_s) were spent"
    task_dir.mkdir(parents=True, exist_ok=False)  # never over an earlier eval's files
    include = in_checkout(task.include_path, root) if task.include_path is not None else None
    python = interpreter.lm_eval_python(spec)
    argv = lm_eval_argv(python, task, ep, job.concurrency, task_dir / RAW, include, request_timeout_s=budget_s)
    error = _bounded(argv, task_dir, task_dir / LM_EVAL_LOG, env, budget_s, spec.timeout_s)
    _move_up(task_dir / RAW, task_dir)
    write_json(task_dir / META_ENV, meta_env(job), indent=2, replace=False)
    found = sorted(task_dir.glob("results*.json"))
    if not found:
        return None, error or f"lm-eval wrote no results (see {task.name}/{LM_EVAL_LOG})"
    return json.loads(found[-1].read_text()), error


def _bounded(
    argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None, budget_s: float, bound_s: float
) -> str | None:
    """Run lm-eval in its own session, killed whole past the budget; None when it exited 0."""
    with log.open("wb") as out:
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as e:  # accuracy.python gone since the preflight found it
            return f"lm-eval did not start: accuracy.python {argv[0]}: {e.strerror or e}"
        try:
            rc = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return f"lm-eval did not finish within the eval's {bound_s:.0f} s (accuracy.timeout_s)"
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        return f"lm-eval exited with code {rc}: " + " | ".join(tail)
    return None


def _move_up(raw: Path, task_dir: Path) -> None:
    """lm-eval's <output>/<model>/*.json* moved into the task's directory, as InferenceX stages them."""
    if not raw.is_dir():
        return
    for f in sorted(raw.rglob("*.json*")):
        target = task_dir / f.name
        if not target.exists():
            f.rename(target)
    for d in [*sorted((p for p in raw.rglob("*") if p.is_dir()), reverse=True), raw]:
        if not any(d.iterdir()):
            d.rmdir()
