"""The sweep writes each point's `kv_handoff` section from its decode servers' NIXL histograms as
scraped around the point, and says it in the log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.kv_fakes import NixlMetrics
from helpers.mock_engine import Engine

from harness import tiny_model
from harness.bench import ClientConfig, run_sweep_detailed

pytestmark = pytest.mark.timeout(120)


def test_each_point_carries_its_nixl_handoff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(tiny_model.build(tmp_path / "m"))
    metrics = NixlMetrics()
    try:
        with Engine(model="tiny") as engine:
            cfg = ClientConfig(
                base_url=engine.url,
                model="tiny",
                tokenizer=model,
                isl=16,
                osl=4,
                concurrency=[2],
                num_prompts=4,
                num_warmups=0,
                result_dir=str(tmp_path / "r"),
                prefill_gpus=1,
                decode_gpus=1,
                kv_connector="nixl",
                health_check_interval_s=0,
                scrape=[f"decode-0=decode@{metrics.url}"],
            )
            (o,) = run_sweep_detailed(cfg)
    finally:
        metrics.close()
    assert o.path is not None, o.error
    assert metrics.scrapes >= 2  # the precondition: the point was scraped before and after
    h = json.loads(o.path.read_text())["kv_handoff"]
    # Every scrape but the point's first came after one more transfer: all of them are the point's.
    assert h["connector"] == "nixl" and h["source"] == "vllm_metrics"
    assert 1 <= h["transfers"] <= metrics.scrapes - 1
    assert h["bytes_per_transfer"] == 64 << 20 and h["descriptors_per_transfer"] == 8
    assert h["gbps_mean"] == pytest.approx((64 << 20) / 0.02 / 1e9)
    assert h["lane"] is None
    assert f"KV handoff: {h['transfers']} transfers of 64.0 MiB" in capsys.readouterr().err
