"""The breakdown's server means and the bottleneck section through a real sweep: mock engines behind
`pdbench proxy`, measured by the bench client, which scrapes two /metrics servers that export
vLLM's per-request histograms with known means. The point means land in the result, labelled,
and the second point's growth is against the first."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.harness_procs import start_harness, wait_ok
from helpers.metrics_server import serve_metrics

from benchmarks.common import free_ports
from harness import tiny_model
from harness.bench import ClientConfig, run_sweep_detailed

pytestmark = pytest.mark.timeout(120)

# Seconds per request of each histogram, as vLLM 0.32 names them; every scrape adds 3 requests.
MEANS = {
    "prefill": {"queue_time": 0.030, "prefill_time": 0.040, "time_per_output_token": 0.0},
    "decode": {"queue_time": 0.020, "prefill_time": 0.005, "time_per_output_token": 0.007},
}
PER_SCRAPE = 3


def _metrics_server(role: str, port: int) -> ThreadingHTTPServer:
    scrapes = [0]

    def render() -> str:
        scrapes[0] += 1
        n = scrapes[0] * PER_SCRAPE
        lines = []
        for name, mean in MEANS[role].items():
            family, labels = f"vllm:request_{name}_seconds", '{engine="0",model_name="tiny"}'
            lines += [f"{family}_sum{labels} {n * mean}", f"{family}_count{labels} {n}"]
        return "\n".join(lines) + "\n"

    return serve_metrics(render, port)


@pytest.fixture
def metrics_ports() -> Iterator[tuple[int, int]]:
    ports = free_ports(2)
    servers = [_metrics_server(role, port) for role, port in zip(MEANS, ports, strict=True)]
    yield ports[0], ports[1]
    for s in servers:
        s.shutdown()
        s.server_close()


def test_server_means_and_growth_reach_the_result(metrics_ports: tuple[int, int], tmp_path: Path) -> None:
    model_dir = str(tiny_model.build(tmp_path / "m"))
    p_port, d_port, proxy_port = free_ports(3)
    upstream = ["--prefill", f"http://127.0.0.1:{p_port}", "--decode", f"http://127.0.0.1:{d_port}"]
    procs = [
        start_harness(["mock-engine", "--model", "tiny", "--itl-ms", "20", *e], tmp_path / f"engine{i}.log")
        for i, e in enumerate(
            [
                ["--port", str(p_port), "--role", "prefill", "--ttft-ms", "50"],
                ["--port", str(d_port), "--role", "decode"],
            ]
        )
    ]
    try:
        procs.append(
            start_harness(
                ["proxy", "--port", str(proxy_port), *upstream, "--timings-dir", str(tmp_path / "proxy-timings")],
                tmp_path / "proxy.log",
            )
        )
        wait_ok(f"http://127.0.0.1:{proxy_port}/health", procs)
        mp, md = metrics_ports
        cfg = ClientConfig(
            base_url=f"http://127.0.0.1:{proxy_port}",
            model="tiny",
            tokenizer=model_dir,
            isl=64,
            osl=3,
            concurrency=[1, 4],
            num_prompts=8,
            num_warmups=0,
            result_dir=str(tmp_path),
            proxy_timings_dir="proxy-timings",
            scrape=[f"prefill-0=prefill@http://127.0.0.1:{mp}", f"decode-0=decode@http://127.0.0.1:{md}"],
            prefill_gpus=1,
            decode_gpus=1,
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
    assert [o.ok for o in outcomes] == [True, True], [o.error for o in outcomes]
    results = [json.loads(o.path.read_text()) for o in outcomes]
    for r in results:
        assert (tmp_path / "metrics" / f"concurrency_{r['max_concurrency']}" / "prefill-0.after.prom").is_file()
        b = r["ttft_breakdown"]
        assert b["requests"] == 8 and b["adds_up"]["share"] == 1.0, b
        assert "server_means" in b["point_means"] and "not per request" in b["point_means"]
        means = b["server_means"]
        assert set(means) == {"prefill", "decode"}
        for role, expect in MEANS.items():
            m = means[role]
            assert m["requests"] > 0 and m["requests"] % PER_SCRAPE == 0, m
            assert m["queue_ms"] == pytest.approx(expect["queue_time"] * 1000, abs=1e-3)
            assert m["compute_ms"] == pytest.approx(expect["prefill_time"] * 1000, abs=1e-3)
            assert m["tpot_ms"] == pytest.approx(expect["time_per_output_token"] * 1000, abs=1e-3)
        assert r["bottleneck"]["evidence"]["roles"] == means  # the verdict used the same numbers
    first, second = (r["bottleneck"] for r in results)
    assert first["evidence"]["baseline_concurrency"] is None and first["evidence"]["growth"] == {}
    assert second["evidence"]["baseline_concurrency"] == 1
    assert second["evidence"]["growth"] == {"prefill": 1.0, "decode": 1.0, "decode_wait": 1.0}
    # Queue 30 ms >= 0.5 x compute 40 ms on prefill: saturated by its queue at both points.
    assert first["saturated"] == second["saturated"] == ["prefill"] and second["verdict"] == "prefill-bound"
