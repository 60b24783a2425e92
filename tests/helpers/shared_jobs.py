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

from harness.bench.trace_gen import TraceGenSettings
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


#: The 1P1D NIXL job (the tiny Llama, prefill's vLLM on core 0 and decode's on core 1) of the
#: tests that differ only in what the client sends: one set of servers, five sweeps
#: (benchmark.workloads). Its own sweep and `prefill-bound` are test_bottleneck_e2e's (sentinels
#: off: they would only add requests); `trace` is test_bench_trace_e2e's replay of TRACE_FILE,
#: `sessions` test_sessions_e2e's multi-turn sessions, `agentic` test_external_clients_vllm's aiperf
#: on WEKA_TRACE with `vllm bench serve` after it, each with the settings its test had in a job of
#: its own. `agentic` runs last, so that the others' verdicts are as they were.
WORKLOADS_RECIPE = "tiny-fp32-cpu-nixl-1p1d"
TRACE_FILE = "trace.jsonl"  # in the job's results root, written before the job
WEKA_TRACE = "weka"  # the same: a folder of agentic traces (helpers.external_clients.write_weka_trace)
AGENTIC, AGENTIC_CONCURRENCY, AGENTIC_PROMPTS = "agentic", 2, 8
SESSIONS, TURNS, SESSIONS_CONCURRENCY = 4, 3, 2
# vLLM's CPU backend caches prefixes in blocks of 128 tokens: the trace's blocks are that size, so
# each block a later request re-sends is one whole cache block. 4 sessions of 3 turns (256, 384
# and 512 tokens), every session starting with one shared block.
TRACE = TraceGenSettings(
    sessions=4, turns=3, rate=4.0, think_s=0.5, shared_blocks=1, first_blocks=1, new_blocks=1, output_length=4,
    block_tokens=128, seed=0,
)  # fmt: skip
# What the trace and sessions jobs ran with before they shared this one: the recipe's own.
AS_ALONE = {"cooldown_s": 1.0, "sentinels": {"enabled": True}, "prompts_multiplier": 4, "min_prompts": 8}


def workloads_overrides(trace: Path, weka: Path | None) -> tuple[str, ...]:
    """The job's settings; `agentic` with a Weka trace only (None: aiperf is not installed here,
    and its test skips, or fails where aiperf is required, rather than every reader with the job)."""
    workloads: dict[str, dict] = {
        "prefill-bound": {"isl": 2048, "osl": 2, "concurrency": [1, 8]},
        "trace": {
            "dataset": "mooncake_trace",
            "dataset_path": str(trace),
            "trace": {"block_tokens": 128, "speed": 2.0},
            "concurrency": [4],
            "isl": 512,
            "osl": 4,
            "num_warmups": 1,
            **AS_ALONE,
            "sentinels": {"enabled": True},
        },
        "sessions": {
            "dataset": "sessions",
            "concurrency": [SESSIONS_CONCURRENCY],
            "isl": 256,
            "osl": 4,
            "num_warmups": None,
            **AS_ALONE,
            "sentinels": {"enabled": True},
            "sessions": {
                "turns": TURNS,
                "user_tokens": 128,
                "num_sessions": SESSIONS,
                "num_warmup_sessions": 1,
                "think_time_s": 0.2,
            },
        },
    }
    if weka is not None:
        workloads[AGENTIC] = {
            # aiperf runs InferenceX's agentic scenario as the sweep's client, then `vllm bench serve`
            # measures the same servers at the recipe's shape (of the job's other settings only
            # num_warmups reaches it, 2 as the recipe's).
            "client": "aiperf",
            "cross_check": ["vllm"],
            "concurrency": [AGENTIC_CONCURRENCY],
            "endpoint": "chat",
            "num_prompts": AGENTIC_PROMPTS,
            "isl": 256,
            "osl": 32,
            "aiperf": {"scenario": "inferencex-agentx-mvp", "weka_trace": str(weka), "benchmark_duration_s": 6},
        }
    return (
        # The job's own sweep: ISL 16, OSL 256 at C=1 and 64, two waves of 64 (the second waits
        # for decode's full steps).
        "benchmark.isl=16",
        "benchmark.osl=256",
        "benchmark.concurrency=[1,64]",
        "benchmark.prompts_multiplier=2",
        "benchmark.min_prompts=4",
        "benchmark.num_warmups=2",
        "benchmark.cooldown_s=0",
        "benchmark.sentinels.enabled=false",
        f"benchmark.workloads={json.dumps(workloads)}",
    )
