"""A Mooncake-format trace, generated here with shared hash ids, replayed by a job on real vLLM
(local launcher, 1P1D tiny model, prefix caching on as vLLM V1's default): the result carries the
replay's `schedule` (its lateness) and prefill's prefix cache found the blocks the trace shares.
The replay is the `trace` workload of the session's shared job (helpers/shared_jobs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.shared_jobs import TRACE_FILE

pytestmark = pytest.mark.vllm


def test_a_generated_trace_replays_with_its_lateness_and_prefix_hits(workloads_job: Path) -> None:
    trace = workloads_job.parents[1] / TRACE_FILE
    where = workloads_job / "workloads" / "trace"
    (f,) = where.glob("concurrency_4_*.json")
    r = json.loads(f.read_text())
    assert r["completed"] == 12 and r["failed"] == 0 and r["dataset_name"] == "mooncake_trace"
    assert r["metadata"]["workload"] == "trace" and r["metadata"]["valid"] is True

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
