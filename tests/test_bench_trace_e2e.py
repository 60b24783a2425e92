"""A Mooncake-format trace, generated here with shared hash ids, replayed by a job on real vLLM
(local launcher, 1P1D tiny model, prefix caching on as vLLM V1's default): the result carries the
replay's `schedule` (its lateness) and prefill's prefix cache found the blocks the trace shares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import require_vllm
from helpers import tokenizer_cache
from helpers.e2e_jobs import SKIP_FLAG_CHECK

from harness.bench.trace_gen import TraceGenSettings, write_trace

pytestmark = pytest.mark.vllm

RECIPE = "tiny-fp32-cpu-nixl-1p1d"
PORTS = {8100, 8200, 30000, 5600, 5601}
# vLLM's CPU backend caches prefixes in blocks of 128 tokens: the trace's blocks are that size, so
# each block a later request re-sends is one whole cache block. 4 sessions of 3 turns (256, 384
# and 512 tokens), every session starting with one shared block.
TRACE = TraceGenSettings(
    sessions=4, turns=3, rate=4.0, think_s=0.5, shared_blocks=1, first_blocks=1, new_blocks=1, output_length=4,
    block_tokens=128, seed=0,
)  # fmt: skip


def _listening() -> set[int]:
    return {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN} & PORTS


def test_a_generated_trace_replays_with_its_lateness_and_prefix_hits(tmp_path: Path) -> None:
    require_vllm()
    assert not _listening(), f"ports already in use: {_listening()}"
    trace = tmp_path / "sessions.jsonl"
    assert write_trace(trace, TRACE) == 12
    results = tmp_path / "results"
    overrides = [
        "benchmark.dataset=mooncake_trace",
        f"benchmark.dataset_path={trace}",
        "benchmark.trace.block_tokens=128",
        "benchmark.trace.speed=2.0",
        "benchmark.concurrency=[4]",
        "benchmark.isl=512",
        "benchmark.osl=4",
        "benchmark.num_warmups=1",
    ]
    args = [sys.executable, "-m", "harness", "submit", "--recipe", RECIPE, "--launcher", "local", *SKIP_FLAG_CHECK]
    args += ["--results-dir", str(results)]
    tokenizer_cache.seed(results)
    for o in overrides:
        args += ["--set", o]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (run_dir,) = (results / RECIPE).iterdir()
    (f,) = run_dir.glob("concurrency_4_*.json")
    r = json.loads(f.read_text())
    assert r["completed"] == 12 and r["failed"] == 0 and r["dataset_name"] == "mooncake_trace"

    s = r["schedule"]
    assert (s["requests"], s["sent"], s["speed"], s["cap"]) == (12, 12, 2.0, 4)
    assert s["span_s"] == pytest.approx(json.loads(trace.read_text().splitlines()[-1])["timestamp"] / 2000)
    late = s["lateness_ms"]
    assert 0 <= late["p50"] <= late["p99"] <= late["max"]
    assert 1 <= s["in_flight_max"] <= 4
    # The first 4 requests always find a free slot: the client's own lateness is there.
    assert s["cap_delayed"] <= 8 and s["client_lateness_ms"] is not None

    # Prefill's own cache found the shared blocks: every later turn re-sends its session's earlier
    # blocks, and every session starts with the shared one.
    prefill = r["prefix_cache"]["roles"]["prefill"]
    assert prefill["queries"] > 0 and prefill["hits"] >= 128 * 8, prefill
    assert r["prefix_cache"]["enabled"] is True
    assert not _listening()
