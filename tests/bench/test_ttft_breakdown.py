"""The TTFT breakdown end to end with real processes: mock engines with known latencies behind
`pdbench proxy --timings-dir`, measured by `pdbench bench`: each part lands where the injected
latency is, and the parts add up to the client's TTFT."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.harness_procs import start_harness, wait_ok
from helpers.inferencex_contract import assert_inferencex_contract

from benchmarks.common import free_ports
from harness import tiny_model
from harness.bench import ClientConfig, run_sweep_detailed
from harness.bench.client import RequestOutput
from harness.bench.ttft_breakdown import ADDS_UP_WITHIN, ttft_breakdown
from harness.rundir.bottleneck_summary import RoleTiming

pytestmark = pytest.mark.timeout(180)
# The mock decode answers a request whose KV came from prefill after one inter-token gap.
PREFILL_MS, DECODE_MS = 200.0, 100.0
# What a loaded machine may add to a part's median (about 1 ms at a load average of 4 on the
# shared 2-core machine): less than the smallest injected latency, so a part that holds
# another part's latency, or the proxy's or client's share holding an engine's, still fails.
SLACK_MS = 75.0
# The mock engine sets its timers early by its loop's median lateness (harness.mock_engine.app,
# _sleep_until), so a leg may end a fraction of a ms before its nominal latency (seen: 99.983 ms).
EARLY_MS = 1.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


@pytest.mark.parametrize("aggregated", [False, True], ids=["disagg", "aggregated"])
def test_parts_sit_where_the_latency_is_and_add_up(aggregated: bool, model_dir: str, tmp_path: Path) -> None:
    p_port, d_port, proxy_port = free_ports(3)
    timings = tmp_path / "proxy-timings"
    if aggregated:
        engines = [["--port", str(d_port), "--role", "both", "--ttft-ms", str(PREFILL_MS + DECODE_MS)]]
        upstream = ["--connector", "none", "--aggregated", f"http://127.0.0.1:{d_port}"]
    else:
        engines = [
            ["--port", str(p_port), "--role", "prefill", "--ttft-ms", str(PREFILL_MS)],
            ["--port", str(d_port), "--role", "decode"],
        ]
        upstream = ["--prefill", f"http://127.0.0.1:{p_port}", "--decode", f"http://127.0.0.1:{d_port}"]
    procs = [
        start_harness(["mock-engine", "--model", "tiny", "--itl-ms", str(DECODE_MS), *e], tmp_path / f"engine{i}.log")
        for i, e in enumerate(engines)
    ]
    try:
        procs.append(
            start_harness(
                ["proxy", "--port", str(proxy_port), *upstream, "--timings-dir", str(timings)], tmp_path / "proxy.log"
            )
        )
        wait_ok(f"http://127.0.0.1:{proxy_port}/health", procs)
        cfg = ClientConfig(
            base_url=f"http://127.0.0.1:{proxy_port}",
            model="tiny",
            tokenizer=model_dir,
            isl=64,
            osl=3,
            concurrency=[1, 4],
            num_prompts=12,
            num_warmups=2,
            result_dir=str(tmp_path),
            proxy_timings_dir="proxy-timings",
            **({"gpus": 1} if aggregated else {"prefill_gpus": 1, "decode_gpus": 1}),
        )
        outcomes = run_sweep_detailed(cfg)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        r = json.loads(o.path.read_text())
        b = r["ttft_breakdown"]
        assert b["requests"] == b["of"] == r["completed"] == 12, b
        # The proxy's record and the client's TTFT are the same requests: medians agree.
        assert b["ttft_ms"]["median"] == pytest.approx(r["median_ttft_ms"], abs=1e-4)  # rounded to 0.1 us
        parts = ["router_ms", "decode_ms", "client_ms"] + ([] if aggregated else ["prefill_ms"])
        total = sum(b[p]["mean"] for p in parts)
        assert total == pytest.approx(b["ttft_ms"]["mean"], rel=0.001), b  # per request they add up exactly
        if aggregated:
            assert "prefill_ms" not in b
            assert PREFILL_MS + DECODE_MS - EARLY_MS <= b["decode_ms"]["median"] < PREFILL_MS + DECODE_MS + SLACK_MS, b
        else:
            assert PREFILL_MS - EARLY_MS <= b["prefill_ms"]["median"] < PREFILL_MS + SLACK_MS, b
            assert DECODE_MS - EARLY_MS <= b["decode_ms"]["median"] < DECODE_MS + SLACK_MS, b
        # What the proxy itself adds, and what lies outside it, are small next to the engines' time.
        assert b["router_ms"]["median"] < SLACK_MS and 0 <= b["client_ms"]["median"] < SLACK_MS, b
        assert "kv_transfer_ms" not in b  # nothing scraped: no transfer histogram to read
        assert b["adds_up"]["share"] == 1.0 and b["adds_up"]["requests"] == 12, b
        assert r["bottleneck"]["evidence"]["shares"] and r["bottleneck"]["verdict"], r["bottleneck"]
        assert_inferencex_contract(o.path)  # the new sections keep the file ingestible
    assert len(list(timings.glob("proxy-timings-*.jsonl"))) == 1


def test_requests_the_proxy_did_not_record_are_counted_out() -> None:
    ok = RequestOutput(10, 4)
    ok.success, ok.ttft = True, 0.1
    failed = RequestOutput(10, 4)
    rec = {"router_ms": 1.0, "prefill_ms": 50.0, "decode_ms": 40.0, "first_byte_ms": 91.0}
    b = ttft_breakdown([ok, ok, failed], ["a", "b", "c"], {"a": rec | {"id": "a"}, "c": rec}, (12.0, 3))
    assert (b["requests"], b["of"]) == (1, 2)
    assert b["client_ms"]["median"] == pytest.approx(9.0)
    assert b["kv_transfer_ms"]["mean"] == 12.0 and b["decode_first_token_ms"]["median"] == 28.0
    none = ttft_breakdown([ok], ["x"], {}, None)
    assert none["requests"] == 0 and "recorded none" in none["note"]


def test_parts_add_up_per_request_and_server_means_are_labelled_point_means() -> None:
    outs = []
    for ttft in (0.1, 0.2):
        o = RequestOutput(10, 4)
        o.success, o.ttft = True, ttft
        outs.append(o)
    exact = {"router_ms": 1.0, "prefill_ms": 50.0, "decode_ms": 40.0, "first_byte_ms": 91.0}
    # A gap between the proxy's legs (decode sent 10 ms after prefill answered) is in no part.
    gap = {"router_ms": 1.0, "prefill_ms": 100.0, "decode_ms": 50.0, "first_byte_ms": 161.0}
    servers = {"prefill": RoleTiming(requests=2, queue_ms=3.0, compute_ms=45.0, tpot_ms=0.0)}
    b = ttft_breakdown(outs, ["a", "b"], {"a": exact, "b": gap}, None, servers)
    assert b["adds_up"] == {"within": ADDS_UP_WITHIN, "requests": 1, "of": 2, "share": 0.5}
    assert b["server_means"] == {"prefill": {"requests": 2, "queue_ms": 3.0, "compute_ms": 45.0, "tpot_ms": 0.0}}
    assert "per request" in b["per_request"] and "server_means" in b["point_means"]
    assert "not per request" in b["point_means"] and "kv_transfer_ms" in b["point_means"]
