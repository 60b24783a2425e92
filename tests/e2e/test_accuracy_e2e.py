"""lm-eval for real against real vLLM through pdbench's proxy: a tiny-fp32-cpu-pdbench-1p1d job of
the copy model with the fixture task passes its threshold; the same job with the bundled
connector's debug_corrupt (decode zeroes its last received KV block per layer) falls under it
and fails, naming the task, the score and the threshold in status.json. The same two jobs check
the sentinel prompts of their (one) point: all equal to the prefill instance's whole answers,
and, corrupted, the first point invalid by outputs_match, naming the prompt and the position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require_vllm
from helpers.accuracy_rows import collect_rows
from helpers.e2e_jobs import assert_nothing_left, assert_outputs_match, finish, launch
from helpers.shared_jobs import ACCURACY, PDBENCH_COPY_RECIPE
from helpers.shared_jobs import EVAL_THRESHOLD as THRESHOLD

pytestmark = pytest.mark.vllm

RECIPE = PDBENCH_COPY_RECIPE
# One small point (the sweep is not what is tested here) and 16 samples of the fixture task.
OVERRIDES = (
    "model=pdbench-copy",
    "benchmark.concurrency=[2]",
    "benchmark.isl=128",
    "benchmark.osl=8",
    "benchmark.min_prompts=4",
    "benchmark.prompts_multiplier=1",
    *ACCURACY,
)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "evals" / "disagg-after" / "pdbench-accuracy.json").read_text())


def test_copy_task_passes_through_the_proxy(pdbench_copy_job: Path) -> None:
    # The session's one job of the copy model with this eval (conftest.pdbench_copy_job): it
    # succeeded and left nothing running; its point is the recipe's shape at C=2.
    run_dir = pdbench_copy_job
    s = _summary(run_dir)
    assert s["error"] is None and s["passed"] is True, s
    (task,) = s["tasks"]
    assert task["samples"] == 16 and task["score"] == 1.0 and task["passed"] is True, task
    assert s["base_url"] == "http://127.0.0.1:30000/v1/completions" and s["concurrency"] == 2
    task_dir = run_dir / "evals" / "disagg-after" / "pdbench_copy"
    meta = json.loads((task_dir / "meta_env.json").read_text())
    assert meta["is_multinode"] is True and meta["conc"] == 2 and meta["model"] == "copy"
    (results,) = task_dir.glob("results*.json")
    assert json.loads(results.read_text())["results"]["pdbench_copy"]["exact_match,strict-match"] == 1.0
    # What InferenceX's collector would read of lm-eval's real files (the contract).
    assert collect_rows(run_dir / "evals" / "disagg-after") == [
        {"task": "pdbench_copy", "is_multinode": True, "conc": 2, "score": 1.0, "n_eff": 16, "model": "copy"}
    ]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "succeeded"
    (point,) = run_dir.glob("concurrency_2_*.json")
    assert_outputs_match(json.loads(point.read_text()), run_dir)


def test_corrupted_kv_drops_the_score_and_fails_the_job(tmp_path: Path) -> None:
    require_vllm()
    proc, watcher = launch(tmp_path, *OVERRIDES, "connector.extra_config.debug_corrupt=true", recipe=RECIPE)
    rc, out = finish(proc, watcher, timeout=600)
    assert rc != 0, out[-4000:]
    (run_dir,) = (tmp_path / RECIPE).iterdir()
    s = _summary(run_dir)
    (task,) = s["tasks"]
    assert task["samples"] == 16 and task["score"] is not None and task["score"] < THRESHOLD, task
    assert task["passed"] is False and s["passed"] is False
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed"
    reason = json.dumps(status)
    assert "pdbench_copy" in reason and f"{task['score']:.4f}" in reason and f"threshold {THRESHOLD}" in reason
    # The sentinels caught it in the point itself, before any eval ran.
    (point,) = run_dir.glob("concurrency_2_*.json")
    r = json.loads(point.read_text())
    assert r["metadata"]["valid"] is False and r["sentinels"]["matched"] < r["sentinels"]["sent"] == 4, r["sentinels"]
    why = r["metadata"]["validity"]["reasons"][0]
    assert why.startswith("outputs_match: ") and " (prompt '" in why and "first differs at token " in why, why
    assert "reference '" in why and "answer '" in why, why
    assert_nothing_left(watcher)
