"""Real jobs that several end-to-end tests only read, run once per test session.

A local job on real vLLM costs its servers' start (tens of seconds each on 2 cores) and its
sweep; tests that only read what a finished job left in its run directory share one job
instead of each starting the same servers again. A job here takes the union of what its
readers asked of their own jobs, never less of any, and asserts what they all asserted of it:
it succeeded and left no process and no port behind. Tests ask for it through conftest's
session fixtures (the first reader runs it; a failed job fails every reader with its output).
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import require_vllm

from helpers.e2e_jobs import assert_nothing_left, finish, launch

#: The copy model's lm-eval fixture task (docs/accuracy.md), its threshold and sample count.
EVAL_TASKS = Path(__file__).resolve().parents[1] / "fixtures" / "evals" / "pdbench_copy"
EVAL_THRESHOLD = 0.95  # 16 of 16 right passes; the corrupted KV here gets 13 of 16 (0.8125)
EVAL_SAMPLES = 16
ACCURACY = (
    "accuracy.enabled=true",
    f'accuracy.tasks=[{{"name": "pdbench_copy", "limit": {EVAL_SAMPLES}, "threshold": {EVAL_THRESHOLD}, '
    f'"metric": "exact_match,strict-match", "include_path": "{EVAL_TASKS}"}}]',
    "accuracy.timeout_s=300",
)

PDBENCH_COPY_RECIPE = "tiny-fp32-cpu-pdbench-1p1d"
#: The bundled connector as a job runs it, with the copy model (whose answers show wrong KV):
#: one point at C=2 of the recipe's shape (ISL 256, OSL 32, 8 prompts), the proxy's two-phase
#: flow, and the fixture task through the proxy after the sweep. Read by
#: test_e2e_vllm.test_bundled_connector_job (the connector's config, the point),
#: test_connector_timings_e2e (two-phase: every request's pull) and
#: test_accuracy_e2e.test_copy_task_passes_through_the_proxy (the eval).
PDBENCH_COPY_C2 = ("model=pdbench-copy", "benchmark.concurrency=[2]", "proxy.overlap=false", *ACCURACY)


def run_finished_job(results: Path, *overrides: str, recipe: str, timeout: float) -> Path:
    """Run `recipe` with `overrides` on the local launcher into `results`; its run directory,
    once the job has succeeded and nothing of it is left running."""
    require_vllm()
    proc, watcher = launch(results, *overrides, recipe=recipe)
    rc, out = finish(proc, watcher, timeout=timeout)
    assert rc == 0, out[-4000:]
    (run_dir,) = (results / recipe).iterdir()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "succeeded", out[-4000:]
    assert_nothing_left(watcher)
    return run_dir
