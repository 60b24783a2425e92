"""The rule kv_transport at its edges: a point's KV rate against the ceiling measured in the same
job (just below and above the share, small transfers left out, no ceiling, a rate above it), its
early check on NIXL's histograms, its settings in a recipe, and the report's table and summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.kv_fakes import NixlDecode, T, ceiling, line

from harness.config import ConfigError, load_recipe
from harness.config.benchmark import ValidityThresholds
from harness.config.load import PROJECT_ROOT
from harness.report import output_md, output_text
from harness.report.build import build_report
from harness.report.run_summary import run_summaries
from harness.rundir.kv_ceiling import missing
from harness.validity import stopped_early, unverified
from harness.validity.kv_handoff import from_connector_records, from_nixl_scrapes
from harness.validity.kv_transport import early_reason, judge, with_kv_transport

GIB, MIB = 1 << 30, 1 << 20


def at(gbps: float, n: int = 4, nbytes: int = GIB, path: str = "ipc") -> list[dict]:
    """n of the bundled connector's lines of `nbytes` each, moved at `gbps` (2 ms of wait left out)."""
    return [line(nbytes / (gbps * 1e6) + 2.0, 2.0, nbytes, path) for _ in range(n)]


def test_just_below_the_share_is_degraded_transport_naming_lane_rate_ceiling_and_causes() -> None:
    h = from_connector_records("pdbench", at(4.9, path="tcp"))
    r, section = judge(h, ceiling(100.0), T, "pdbench")
    assert r.status == "failed" and r.measured == pytest.approx(0.049)
    assert section is not None and section.flag == "degraded_transport" and section.share == pytest.approx(0.049)
    assert section.ceiling_gbps == pytest.approx(100.0) and section.judged_transfers == 4
    for needle in ("degraded_transport", "lane tcp", "4.90 GB/s", "4.9% of the ceiling 100.0 GB/s", "below 5%"):
        assert needle in r.detail, r.detail
    # The usual causes are the connector's own (the connector table's): a socket where IPC was
    # expected for the bundled connector, UCX's transports and descriptors for NIXL.
    assert "lane tcp between GPUs" in r.detail and "chunk_bytes" in r.detail and "UCX" not in r.detail
    nixl, _ = judge(h, ceiling(100.0), T, "nixl")
    assert nixl.status == "failed"
    assert all(x in nixl.detail for x in ("UCX_TLS", "pull", "block", "NIC")), nixl.detail
    v = with_kv_transport(unverified("x").model_copy(update={"verdict": "valid", "valid": True, "reasons": []}), r)
    assert v.verdict == "invalid" and v.valid is False and v.reasons[0].startswith("kv_transport: degraded_transport")


def test_a_point_stopped_early_for_the_same_finding_says_it_once() -> None:
    r, _ = judge(from_connector_records("pdbench", at(4.9, path="tcp")), ceiling(100.0), T, "pdbench")
    valid = unverified("x").model_copy(update={"verdict": "valid", "valid": True, "reasons": []})
    stopped = stopped_early(valid, r.detail, 10.0)
    v = with_kv_transport(stopped, r)
    assert v.verdict == "invalid" and [x.name for x in v.rules] == ["early_evidence", "kv_transport"]
    assert sum(x.count(r.detail) for x in v.reasons) == 1, v.reasons
    # Stopped for something else (or with other figures): both reasons stand, the rule's first.
    other = with_kv_transport(stopped_early(valid, "failed_requests: 3 of 4", 10.0), r)
    assert other.reasons[0].startswith("kv_transport: degraded_transport") and len(other.reasons) == 2


def test_just_above_the_share_passes() -> None:
    h = from_connector_records("pdbench", at(5.1))
    r, section = judge(h, ceiling(100.0), T, "pdbench")
    assert r.status == "passed" and section is not None and section.flag is None
    assert section.share == pytest.approx(0.051)
    valid = unverified("x").model_copy(update={"verdict": "valid", "valid": True, "reasons": []})
    assert with_kv_transport(valid, r).verdict == "valid"
    # The share is the recipe's: at 6 % the same point is degraded.
    r6, _ = judge(h, ceiling(100.0), T.model_copy(update={"kv_min_ceiling_share": 0.06}), "pdbench")
    assert r6.status == "failed" and "below 6%" in r6.detail


def test_small_transfers_are_left_out_of_the_judged_rate() -> None:
    # 100 transfers of 64 MiB at 0.1 GB/s (latency-bound, left out) and 2 of 2 GiB at 50 GB/s.
    lines = at(0.1, n=100, nbytes=64 * MIB) + at(50.0, n=2, nbytes=2 * GIB)
    h = from_connector_records("pdbench", lines, GIB)
    assert h is not None and h.transfers == 102 and h.judged_transfers == 2
    assert h.judged_gbps == pytest.approx(50.0) and h.gbps_mean is not None and h.gbps_mean < 5.0
    r, _ = judge(h, ceiling(100.0), T, "pdbench")
    assert r.status == "passed"
    # Only small ones: not judged, and said why.
    small = from_connector_records("pdbench", at(0.1, n=10, nbytes=64 * MIB), GIB)
    r, section = judge(small, ceiling(100.0), T, "pdbench")
    assert r.status == "not_checked" and section is not None and section.share is None and section.flag is None
    assert "none of the 10 KV transfer(s) (64 MiB on average) counts" in r.detail
    assert "kv_judged_min_bytes (1,024 MiB)" in r.detail
    # With the bound lowered they count, and the slow lane shows.
    low = T.model_copy(update={"kv_judged_min_bytes": 32 * MIB})
    lowered = from_connector_records("pdbench", at(0.1, n=10, nbytes=64 * MIB), 32 * MIB)
    r, _ = judge(lowered, ceiling(100.0), low, "pdbench")
    assert r.status == "failed"


def test_no_ceiling_no_verdict_but_said_so() -> None:
    h = from_connector_records("pdbench", at(0.1))
    r, section = judge(h, None, T, "pdbench")
    assert r.status == "not_checked" and "no ceiling was measured (state/kv_ceiling.json" in r.detail
    assert section is not None and section.ceiling_gbps is None and section.flag is None
    assert "no ceiling was measured" in section.ceiling
    gone = missing("prefill-0 is on node 0 and decode-0 on node 1: the ceiling across nodes ... is not built")
    r, section = judge(h, gone, T, "pdbench")
    assert r.status == "not_checked" and r.detail.startswith("no ceiling: prefill-0 is on node 0")
    r, _ = judge(h, ceiling(100.0), T.model_copy(update={"kv_min_ceiling_share": 0.0}), "pdbench")
    assert r.status == "not_checked" and "is 0: not judged" in r.detail
    r, section = judge(None, ceiling(100.0), T, "mooncake")
    assert r.status == "not_checked" and section is None and "mooncake connector reported no" in r.detail


def test_a_rate_above_the_ceiling_is_a_metric_error_not_a_pass() -> None:
    h = from_connector_records("pdbench", at(120.0))
    r, section = judge(h, ceiling(100.0, best=105.0), T, "pdbench")
    assert r.status == "not_checked" and section is not None and section.flag == "metric_error"
    assert r.detail.startswith("metric_error:") and "above the fastest copy the node made (105.0 GB/s)" in r.detail
    # Within the slack over the fastest copy: measured noise, judged as usual.
    r, section = judge(from_connector_records("pdbench", at(110.0)), ceiling(100.0, best=105.0), T, "pdbench")
    assert r.status == "passed" and section is not None and section.flag is None


def test_nixl_is_judged_on_its_mean_transfer_and_early_from_a_sample() -> None:
    server = NixlDecode()
    before = server.text()
    for _ in range(5):  # the 32k cliff: 4 GiB at 8.2 GB/s against a 396 GB/s peer copy
        server.transfer(4 * GIB / 8.2e9, 4 * GIB, 131_072, 0.44)
    h = from_nixl_scrapes([(before, server.text())])
    assert h is not None and h.judged_transfers == 5 and h.judged_gbps == pytest.approx(8.2)
    r, section = judge(h, ceiling(396.0), T, "nixl")
    assert r.status == "failed" and section is not None and section.share == pytest.approx(8.2 / 396, 0.01)
    assert "lane not proven" in r.detail
    assert judge(h, ceiling(396.0), ValidityThresholds(), "nixl")[0].status == "failed"  # the default, 3 %
    why = early_reason([(before, server.text())], ceiling(396.0), T)
    assert why is not None and why.startswith("degraded_transport")
    # Healthy (16k at 190 GB/s) or no ceiling: nothing to stop for.
    healthy = NixlDecode()
    b2 = healthy.text()
    healthy.transfer(2 * GIB / 190e9, 2 * GIB, 96, 0.0012)
    assert early_reason([(b2, healthy.text())], ceiling(396.0), T) is None
    assert early_reason([(before, server.text())], None, T) is None
    # A point of 512 MiB transfers (mean under the 1 GiB asked for) is not judged.
    small = NixlDecode()
    b3 = small.text()
    small.transfer(0.5, 512 * MIB, 77, 0.001)
    h = from_nixl_scrapes([(b3, small.text())], GIB)
    assert h is not None and h.judged_transfers == 0 and h.judged_gbps is None


def test_the_settings_are_recipe_keys_checked_at_load(tmp_path: Path) -> None:
    shutil.copytree(PROJECT_ROOT / "recipes", tmp_path / "recipes")
    shutil.copy(PROJECT_ROOT / "models.yaml", tmp_path / "models.yaml")
    rr = load_recipe(
        "tiny-fp32-cpu-nixl-1p1d",
        ["benchmark.validity.kv_min_ceiling_share=0.2", "benchmark.validity.kv_judged_min_bytes=1048576"],
        root=tmp_path,
    )
    assert rr.recipe.benchmark.validity.kv_min_ceiling_share == 0.2
    assert rr.recipe.benchmark.validity.kv_judged_min_bytes == 1 << 20
    for bad, needle in (("kv_min_ceiling_share=1.5", "less than or equal to 1"), ("kv_judged_min_bytes=-1", "0")):
        with pytest.raises(ConfigError) as e:
            load_recipe("tiny-fp32-cpu-nixl-1p1d", [f"benchmark.validity.{bad}"], root=tmp_path)
        key = f"benchmark.validity.{bad.split('=')[0]}"
        assert e.value.key == key and needle in str(e.value), str(e.value)


def test_report_shows_ceiling_share_and_the_flag_in_the_runs_summary(tmp_path: Path) -> None:
    fixture = Path(__file__).parents[1] / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
    run = tmp_path / "tiny-fp32-cpu-nixl-1p1d" / fixture.name
    shutil.copytree(fixture, run)
    slow = judge(from_connector_records("pdbench", at(2.0, path="tcp")), ceiling(100.0), T, "pdbench")[1]
    fast = judge(from_connector_records("pdbench", at(60.0)), ceiling(100.0), T, "pdbench")[1]
    for conc, section in ((1, fast), (4, slow)):
        assert section is not None
        (f,) = run.glob(f"concurrency_{conc}_*.json")
        f.write_text(json.dumps(json.loads(f.read_text()) | {"kv_handoff": section.model_dump(mode="json")}))
    report = build_report([run])
    (table,) = [t for t in report.sections if t.title == "KV handoff per point"]
    rows = {r[3]: dict(zip(table.headers, r, strict=True)) for r in table.rows}
    assert rows["1"]["Ceiling GB/s"] == "100.0" and rows["1"]["Share"] == "60%"
    assert rows["4"]["Share"] == "2.0% degraded_transport"
    (finding,) = table.findings
    assert "C=4" in finding and "degraded_transport: 2.00 GB/s over 4 transfer(s), 2.0% of the ceiling" in finding
    (summary,) = run_summaries(report)
    assert summary["kv_transport"] == "degraded_transport at C=4 ISL 256", summary
    assert "KV degraded_transport at C=4" in output_md.render(report)
    assert "KV degraded_transport at C=4" in output_text.render(report, width=200)


def _nixl(seconds: float, nbytes: int, descriptors: int, n: int = 5):
    server = NixlDecode()
    before = server.text()
    for _ in range(n):
        server.transfer(seconds, nbytes, descriptors, 0.001)
    return from_nixl_scrapes([(before, server.text())])


@pytest.mark.parametrize(
    ("case", "seconds", "nbytes", "descriptors", "ceiling_gbps", "verdict"),
    [
        # Measured (docs/gpu.md, vLLM 0.20 + NIXL 1.0.1, 8B Llama, bf16): healthy transfers whose
        # plain rate is mostly the fixed cost pass; every fallback fails, whatever its size.
        ("one H200, cuda_ipc, 512 MiB in 9.1 ms", 0.0091, 512 * MIB, 77, 2070.0, "passed"),
        ("two H200s, 1k tokens, 128 MiB in 3.5 ms", 0.0035, 128 * MIB, 85, 386.2, "passed"),
        ("two H200s, a job's first 512 MiB in 14.4 ms", 0.0144, 512 * MIB, 85, 386.2, "passed"),
        ("two H200s, 32k, block 64 after the pool wrapped: 134 ms", 0.134, 4 * GIB, 32_768, 386.2, "passed"),
        ("two H200s, UCX_TLS=tcp,cuda_copy: 512 MiB in 2.4 s", 2.4, 512 * MIB, 85, 388.1, "failed"),
        ("two H200s, 16k after the pool wrapped: 236 ms", 0.236, 2 * GIB, 47_037, 386.2, "failed"),
        ("two H200s, 32k after the pool wrapped: 517 ms", 0.517, 4 * GIB, 131_072, 386.2, "failed"),
        ("one H200, UCX software emulation: 512 MiB in 1.58 s", 1.581, 512 * MIB, 77, 2070.0, "failed"),
    ],
)
def test_the_defaults_separate_measured_healthy_transfers_from_fallbacks(
    case: str, seconds: float, nbytes: int, descriptors: int, ceiling_gbps: float, verdict: str
) -> None:
    h = _nixl(seconds, nbytes, descriptors)
    assert h is not None and h.judged_transfers == 5, case  # 64 MiB and more are judged by default
    r, section = judge(h, ceiling(ceiling_gbps), ValidityThresholds(), "nixl")
    assert r.status == verdict, (case, r.detail)
    assert section is not None and section.fixed_cost_ms == 20.0
    if verdict == "failed" and descriptors > 10_000:
        assert "measured: " in r.detail and "one per block and layer" in r.detail, r.detail
    elif verdict == "failed":
        assert "measured: " not in r.detail, r.detail
    if case.startswith("two H200s, UCX_TLS"):  # 0.06 %: its digits, not "0.0%"
        assert "0.058% of the ceiling" in r.detail, r.detail


def test_the_fixed_cost_is_taken_from_each_transfer_before_the_rate_is_judged() -> None:
    # 4 transfers of 1 GiB in 219 ms (4.9 GB/s plain) against 100 GB/s and a 5 % share: 20 ms of
    # each is fixed cost, the rest (199 ms) moves the bytes at 5.4 GB/s.
    h = from_connector_records("pdbench", at(4.9))
    with_cost = T.model_copy(update={"kv_fixed_cost_ms": 20.0})
    r, section = judge(h, ceiling(100.0), with_cost, "pdbench")
    assert r.status == "passed" and section is not None
    assert section.beyond_fixed_gbps == pytest.approx(GIB / ((GIB / 4.9e9) - 0.02) / 1e9)
    assert section.share == pytest.approx(section.beyond_fixed_gbps / 100.0)
    assert "(5.39 GB/s beyond 20 ms a transfer)" in r.detail, r.detail
    # Without it, the plain rate: degraded (test_just_below_the_share_...); with a transfer no
    # longer than the fixed cost, nothing is left to judge but it cannot be slow.
    r, section = judge(h, ceiling(100.0), T.model_copy(update={"kv_fixed_cost_ms": 300.0}), "pdbench")
    assert r.status == "passed" and "within the fixed cost of 300 ms a transfer" in r.detail
    assert section is not None and section.share is None and section.flag is None
