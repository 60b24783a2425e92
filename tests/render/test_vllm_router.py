"""proxy.kind vllm-router: validate refuses what the router cannot serve, naming both; every
rendered line passes vllm-router's own parser; the rendered NIXL line, run as the job runs it,
holds its port closed until both mock engines answer /health, then serves the benchmark client,
whose results record the router's version and carry no TTFT breakdown, which the report says."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from string import Template

import pytest
from helpers.cli_run import pdbench
from helpers.mock_engine import Engine

from benchmarks.common import free_ports
from harness import tiny_model
from harness.bench import ClientConfig, run_sweep_detailed
from harness.config.load import load_recipe
from harness.render import vllm_router
from harness.render.commands import Shell, concrete
from harness.report.build import build_report
from harness.topology import plan

pytestmark = pytest.mark.timeout(180)
RECIPES = {
    "nixl": "tiny-fp32-cpu-nixl-1p2d-vs-agg",
    "mooncake": "dsr1-fp8-h200-mooncake-1p2d",
    "moriio": "dsr1-fp8-mi355x-moriio-1p2d",
}


def test_validate_refuses_the_bundled_connector_naming_both() -> None:
    r = pdbench("validate", "tiny-fp32-cpu-pdbench-1p1d", "--set", "proxy.kind=vllm-router", "--skip-flag-check")
    assert r.returncode != 0
    assert "vllm-router does not serve the pdbench connector" in r.stderr, r.stderr
    # What only pdbench's proxy does is refused too, not dropped.
    r = pdbench(
        "validate", "tiny-fp32-cpu-nixl-1p1d", "--set", "proxy.kind=vllm-router", "--set", "proxy.policy=session"
    )
    assert r.returncode != 0 and "proxy.policy: session is pdbench's proxy's" in r.stderr, r.stderr


@pytest.mark.parametrize("connector", sorted(RECIPES))
def test_every_rendered_line_passes_the_routers_parser(connector: str) -> None:
    rr = load_recipe(RECIPES[connector], ["proxy.kind=vllm-router"])
    p = plan(rr)
    lines = {phase: vllm_router.router_argv(rr, p, phase) for phase in p.phases}
    for phase, argv in lines.items():
        assert vllm_router.check_argv(argv) == [], (phase, argv)
    words = [concrete(w) for w in lines["disagg"]]
    assert words[words.index("--kv-connector") + 1] == connector
    assert ("--vllm-discovery-address" in words) == (connector == "moriio")
    # The check is real: the same line without its decode workers is refused by the router.
    if connector != "moriio":
        cut = [w for i, w in enumerate(words) if w != "--decode" and (i == 0 or words[i - 1] != "--decode")]
        assert vllm_router.check_argv(cut) == ["PD disaggregation mode requires --decode"]


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status
    except (urllib.error.URLError, OSError):
        return None


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.2)


def test_rendered_router_is_health_gated_serves_the_client_and_records_its_version(tmp_path: Path) -> None:
    model = str(tiny_model.build(tmp_path / "m"))
    prefill, decode = Engine(model="tiny", role="prefill"), Engine(model="tiny", role="decode")
    port, metrics_port = free_ports(2)
    rr = load_recipe(
        "tiny-fp32-cpu-nixl-1p1d",
        [
            "proxy.kind=vllm-router",
            f"proxy.port={port}",
            f"proxy.metrics_port={metrics_port}",
            f"topology.prefill.port={prefill.port}",
            f"topology.decode.port={decode.port}",
            "timeouts.health_s=60",
        ],
    )
    # As bash expands the line on node 0 of a local job: every node is this host.
    env = {**os.environ, "PDBENCH_PYTHON": sys.executable, "PDBENCH_NODE_ADDR": "127.0.0.1"}
    env |= {f"PDBENCH_NODE_{i}_ADDR": "127.0.0.1" for i in range(2)}
    words = [
        Template(w.text).substitute(env) if isinstance(w, Shell) else w for w in vllm_router.router_argv(rr, plan(rr))
    ]
    assert words[:3] == [sys.executable, "-m", vllm_router.MODULE]
    log = open(tmp_path / "router.log", "wb")  # noqa: SIM115 - the router writes to it until the end
    router = subprocess.Popen(words, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        # Its workers are not up: it must not answer yet, or node 0's gate would pass too early.
        time.sleep(2)
        assert router.poll() is None, (tmp_path / "router.log").read_text()
        assert _health(url) is None
        with prefill, decode:
            _wait(lambda: _health(url) == 200, 30, "vllm-router healthy once its workers are")
            results = tmp_path / "r"
            cfg = ClientConfig(
                base_url=url,
                model="tiny",
                tokenizer=model,
                isl=16,
                osl=4,
                concurrency=[2],
                num_prompts=4,
                num_warmups=0,
                result_dir=str(results),
                prefill_gpus=1,
                decode_gpus=1,
                kv_connector="nixl",
                health_check_interval_s=0,
                metadata={"proxy": "vllm-router"},
            )
            (o,) = run_sweep_detailed(cfg)
            # Both legs went through the router: prefill's one-token leg, then decode's whole answer.
            assert prefill.metrics()["vllm:generation_tokens_total"] == 4
            assert decode.metrics()["vllm:generation_tokens_total"] == 4 * 4
        assert o.path is not None, o.error
        data = json.loads(Path(o.path).read_text())
        assert data["completed"] == 4 and data["failed"] == 0
        assert data["metadata"]["router"] == {
            "kind": "vllm-router",
            "version": importlib.metadata.version("vllm-router"),
            "python": sys.executable,
        }
        assert "ttft_breakdown" not in data
        # The report says what is missing under this router instead of leaving columns empty.
        report = build_report([results])
        assert any(
            f"served through vllm-router {data['metadata']['router']['version']}: no TTFT breakdown" in n
            for n in report.notes
        ), report.notes
        assert "ttft_proxy_ms" not in report.table.columns
    finally:
        router.send_signal(signal.SIGTERM)
        try:
            router.wait(10)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait(10)
        log.close()
