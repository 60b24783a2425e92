"""The sweep judges each point's KV rate against the job's ceiling (state/kv_ceiling.json, read
once before the first point) and a NIXL point whose samples already show a degraded transport is
stopped early; without a ceiling the point is not judged, and says so."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from helpers.kv_fakes import NixlMetrics
from helpers.mock_engine import Engine

from harness import atomic, tiny_model
from harness.bench import ClientConfig, run_sweep_detailed
from harness.bench.validity_probe import PointProbe
from harness.config.benchmark import ValidityThresholds
from harness.rundir.kv_ceiling import KvCeiling
from harness.rundir.paths import KV_CEILING, STATE, server_record_name

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20
# Every scrape of NixlMetrics adds one 64 MiB transfer of 20 ms: 3.36 GB/s, 1.7 % of this ceiling.
CEILING = KvCeiling(status="measured", method="host_memcpy", bytes=1 << 30, repeats=1, seconds=[(1 << 30) / 200e9])
# The default share, 3 %, on the plain rate (no fixed cost per transfer: these 20 ms are all of it).
JUDGE_64MIB = ValidityThresholds(kv_judged_min_bytes=MIB, kv_fixed_cost_ms=0)


def sweep(tmp_path: Path, metrics: NixlMetrics, ceiling: KvCeiling | None) -> dict:
    """One point of 4 requests against the mock engine, decode's /metrics from `metrics`; the
    result's JSON. The job's records directory holds the ceiling (when given) and the server's record."""
    model = str(tiny_model.build(tmp_path / "m"))
    results = tmp_path / "r"
    (results / STATE).mkdir(parents=True)
    atomic.write_json(results / STATE / server_record_name("decode-0"), {"python": None, "versions": {}, "reasons": {}})
    if ceiling is not None:
        (results / STATE / KV_CEILING).write_text(ceiling.model_dump_json())
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
            result_dir=str(results),
            runtime_records_dir=STATE,
            prefill_gpus=1,
            decode_gpus=1,
            kv_connector="nixl",
            health_check_interval_s=0,
            scrape=[f"decode-0=decode@{metrics.url}"],
            validity=JUDGE_64MIB.model_copy(update={"early_check_s": 0}),
        )
        (o,) = run_sweep_detailed(cfg)
    assert o.path is not None, o.error
    assert metrics.scrapes >= 2  # the precondition: the point's transfers were scraped
    return json.loads(o.path.read_text())


def test_a_point_below_its_share_of_the_ceiling_is_invalid(tmp_path: Path) -> None:
    metrics = NixlMetrics()
    try:
        result = sweep(tmp_path, metrics, CEILING)
    finally:
        metrics.close()
    h, v = result["kv_handoff"], result["metadata"]["validity"]
    assert h["flag"] == "degraded_transport" and h["ceiling_gbps"] == pytest.approx(200.0)
    assert h["share"] == pytest.approx((64 * MIB) / 0.02 / 1e9 / 200)
    assert result["metadata"]["valid"] is False and v["verdict"] == "invalid"
    assert v["reasons"][0].startswith("kv_transport: degraded_transport: lane not proven")
    (rule,) = [r for r in v["rules"] if r["name"] == "kv_transport"]
    assert rule["status"] == "failed" and rule["threshold"] == 0.03


def test_without_a_ceiling_the_point_is_not_judged_and_says_so(tmp_path: Path) -> None:
    metrics = NixlMetrics()
    try:
        result = sweep(tmp_path, metrics, None)
    finally:
        metrics.close()
    (rule,) = [r for r in result["metadata"]["validity"]["rules"] if r["name"] == "kv_transport"]
    assert rule["status"] == "not_checked" and "no ceiling was measured" in rule["detail"]
    assert result["kv_handoff"]["flag"] is None and result["kv_handoff"]["share"] is None
    assert not any("kv_transport" in r for r in result["metadata"]["validity"]["reasons"])


def test_a_nixl_point_is_stopped_at_the_first_sample_that_shows_it_degraded(tmp_path: Path) -> None:
    metrics = NixlMetrics()
    stopped = threading.Event()
    reasons: list[str] = []

    def on_invalid(why: str) -> None:
        reasons.append(why)
        stopped.set()

    async def run() -> None:
        t = JUDGE_64MIB.model_copy(update={"early_check_s": 0.01})
        probe = PointProbe(
            [f"decode-0=decode@{metrics.url}"], tmp_path, t, "nixl", on_invalid=on_invalid, kv_ceiling=CEILING
        )
        await probe.start()
        try:
            # The sampler scrapes every 2 s: the first sample after the start shows a transfer.
            await asyncio.wait_for(asyncio.to_thread(stopped.wait, 30), 35)
        finally:
            await probe.cancel()

    try:
        asyncio.run(run())
    finally:
        metrics.close()
    assert stopped.is_set() and metrics.scrapes >= 2
    assert (
        reasons[0].startswith("degraded_transport: lane not proven")
        and "1.7% of the ceiling" in reasons[0]
        and "below 3%" in reasons[0]
    )
