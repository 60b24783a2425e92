"""A real Mooncake PD job on this CPU: vLLM's MooncakeConnector, Mooncake's transfer engine over
TCP on loopback, the copy model, the local launcher running tiny-fp32-cpu-mooncake-1p1d.

It proves what the recording fakes of tests/proxy/test_proxy_connectors.py cannot: the proxy learns the
prefill's engine id from vLLM's own bootstrap server, decode pulls every prompt's KV from prefill
through Mooncake (no transfer failed, by Mooncake's own counters), the answers are right, and
nothing is left running.

One call is answered for vLLM: vLLM 0.32's MooncakeConnectorWorker reads
`torch.accelerator.current_device_index()`, which a CPU-only torch refuses ("Cannot access
accelerator device when none is available"), so the servers start with a sitecustomize that
answers device 0 where torch has no accelerator. Everything after that line is vLLM's and
Mooncake's code. The test fails once vLLM stops making that call, so the answer goes with it.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_vllm
from helpers.e2e_jobs import assert_nothing_left, assert_outputs_match, finish, launch, listening_ports, metric_delta

pytestmark = pytest.mark.vllm

RECIPE = "tiny-fp32-cpu-mooncake-1p1d"
BOOTSTRAP_PORT = 8998  # the recipe's connector.side_channel_port

# Only where torch has no accelerator, and only the one call vLLM's Mooncake worker makes.
CPU_DEVICE_INDEX = """\
import torch

if not torch.accelerator.is_available():
    torch.accelerator.current_device_index = lambda: 0
"""

# vLLM's KV-connector stats line (vllm/distributed/kv_transfer/kv_connector/v1/metrics.py),
# with MooncakeKVConnectorStats.reduce()'s fields.
STATS_LINE = re.compile(r"KV Transfer metrics: (.*)$", re.M)


def require_mooncake() -> None:
    """Mooncake's transfer engine must import (its wheel and libibverbs: scripts/setup_mooncake.sh).
    PDBENCH_REQUIRE_MOONCAKE (set where that script ran) turns a missing one into a failure."""
    r = subprocess.run([sys.executable, "-c", "import mooncake.engine"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        msg = f"mooncake.engine does not import (scripts/setup_mooncake.sh installs it): {r.stderr.strip()[-300:]}"
        if os.environ.get("PDBENCH_REQUIRE_MOONCAKE"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def _assert_cpu_device_answer_still_needed() -> None:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import MooncakeConnectorWorker

    source = inspect.getsource(MooncakeConnectorWorker.__init__)
    assert "torch.accelerator.current_device_index()" in source, (
        "vLLM's Mooncake worker no longer asks torch.accelerator for its device: drop CPU_DEVICE_INDEX"
    )
    assert not torch.accelerator.is_available()
    with pytest.raises(RuntimeError, match="Cannot access accelerator device"):
        torch.accelerator.current_device_index()


def _mooncake_stats(log: str) -> list[dict[str, float]]:
    rows = []
    for line in STATS_LINE.findall(log):
        fields = dict(part.split("=", 1) for part in line.split(", "))
        rows.append({k.strip(): float(v) for k, v in fields.items()})
    return rows


def test_local_1p1d_mooncake_real_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_vllm()
    require_mooncake()
    _assert_cpu_device_answer_still_needed()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CPU_DEVICE_INDEX)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "1")  # Mooncake's counters reach the log every second
    assert not listening_ports({BOOTSTRAP_PORT})

    proc, watcher = launch(tmp_path / "results", "model=pdbench-copy", "benchmark.concurrency=[2]", recipe=RECIPE)
    rc, out = finish(proc, watcher, timeout=600)
    assert rc == 0, out[-4000:]
    (run_dir,) = (tmp_path / "results" / RECIPE).iterdir()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "succeeded"
    (f,) = run_dir.glob("concurrency_2_*.json")
    r = json.loads(f.read_text())
    assert r["failed"] == 0 and r["completed"] == r["num_prompts"] >= 8
    meta = r["metadata"]
    assert meta["connector"] == "mooncake" and meta["valid"] is True, meta["validity"]
    rules = {x["name"]: x for x in meta["validity"]["rules"]}
    assert rules["kv_transferred"]["status"] == "passed" and rules["kv_transferred"]["measured"] >= 0.98
    # vLLM 0.32 exports no Mooncake counters to /metrics: validity says so instead of guessing.
    assert rules["no_failed_or_expired_transfers"]["status"] == "not_checked"
    assert all(v["mooncake-transfer-engine"] for v in meta["runtime_versions"].values())
    assert_outputs_match(r, run_dir)

    # Decode computed no prompt token itself: all came from prefill.
    hits = metric_delta(run_dir, "decode-0", "vllm:external_prefix_cache_hits_total")
    prompt = metric_delta(run_dir, "decode-0", "vllm:prompt_tokens_total")
    computed = metric_delta(run_dir, "decode-0", "vllm:prompt_tokens_by_source_total", source="local_compute")
    assert hits == prompt >= r["total_input_tokens"] > 0 and computed == 0

    # The bootstrap flow: the engine id the proxy sends decode is the one prefill's vLLM
    # registered with its bootstrap server, read from that server (vLLM's own code).
    logs = run_dir / "logs"
    prefill_log = (logs / "prefill-0.log").read_text()
    (engine,) = set(re.findall(r"Creating v1 connector with name: MooncakeConnector and engine_id: (\S+)", prefill_log))
    assert f"Mooncake Bootstrap Server started at 0.0.0.0:{BOOTSTRAP_PORT}" in prefill_log
    assert f"engines per DP rank: {{0: '{engine}'}}" in (logs / "proxy.log").read_text()
    assert "The Mooncake Transfer Engine is using tcp as its protocol." in (logs / "decode-0.log").read_text()

    # Mooncake's own counters (MooncakeKVConnectorStats, logged by each server): prefill sent
    # KV, and neither side counted a failed transfer, a failed receive or an expired request.
    sent = _mooncake_stats(prefill_log)
    assert sum(s["Num successful transfers"] for s in sent) > 0, prefill_log[-3000:]
    for s in sent + _mooncake_stats((logs / "decode-0.log").read_text()):
        assert s["Num failed transfers"] == s["Num failed recvs"] == s["Num KV expired reqs"] == 0, s

    assert_nothing_left(watcher)
    assert not listening_ports({BOOTSTRAP_PORT})
