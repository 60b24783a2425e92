"""A point's KV handoff from what the connector reports: the bundled connector's per-request
lines and NIXL's /metrics histograms as vLLM exposes them (prometheus_client, vLLM's buckets)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.kv_fakes import GIB, NixlDecode, line

from harness.report import output_md
from harness.report.build import build_report
from harness.validity.kv_handoff import describe, from_connector_records, from_nixl_scrapes, point_handoff


def test_nixl_point_counts_only_the_points_transfers_and_finds_the_descriptor_split() -> None:
    server = NixlDecode()
    server.transfer(0.5, 4 * GIB, 77, 0.001)  # before the point: left out by the delta
    before = server.text()
    # The point: 4 GiB per transfer, 99 fast ones (15 ms, 77 descriptors) and one split into
    # 131,072 descriptors of 32 KiB, posted for 0.44 s of its 0.51 s.
    for _ in range(99):
        server.transfer(0.015, 4 * GIB, 77, 0.0011)
    server.transfer(0.51, 4 * GIB, 131_072, 0.44)
    h = from_nixl_scrapes([(before, server.text())])
    assert h is not None and h.source == "vllm_metrics" and h.connector == "nixl"
    assert h.transfers == 100
    assert h.bytes_total == 100 * 4 * GIB and h.bytes_per_transfer == 4 * GIB
    assert h.descriptors_per_transfer == pytest.approx((99 * 77 + 131_072) / 100)
    assert h.bytes_per_descriptor == pytest.approx(400 * GIB / (99 * 77 + 131_072))
    time_s = 99 * 0.015 + 0.51
    assert h.gbps_mean == pytest.approx(400 * GIB / time_s / 1e9)
    assert h.post_share == pytest.approx((99 * 0.0011 + 0.44) / time_s)
    # Buckets: 99 of 100 in (10, 25] ms: the median interpolates inside it; p99 is its top edge.
    assert h.transfer_ms is not None and 10.0 < h.transfer_ms.p50 < 25.0
    assert h.transfer_ms.p99 == pytest.approx(25.0)
    assert h.transfer_ms.min is None and h.transfer_ms.max is None  # not in a histogram
    assert h.gbps is not None and h.gbps.p50 == pytest.approx(4 * GIB / (h.transfer_ms.p50 * 1e6))
    assert h.gbps.p99 < h.gbps.p50  # the slow tail is the lower rate
    assert h.lane is None and "UCX" in h.lane_note


def test_nixl_without_transfers_or_histograms_gives_no_section() -> None:
    server = NixlDecode()
    text = server.text()
    assert from_nixl_scrapes([(text, text)]) is None  # nothing moved during the point
    assert from_nixl_scrapes([("", "vllm:num_requests_running 0\n")]) is None  # no NIXL metrics


def test_two_decode_servers_add_up() -> None:
    a, b = NixlDecode(), NixlDecode()
    before = (a.text(), b.text())
    a.transfer(0.02, GIB, 64, 0.001)
    b.transfer(0.04, GIB, 64, 0.001)
    h = from_nixl_scrapes([(before[0], a.text()), (before[1], b.text())])
    assert h is not None and h.transfers == 2 and h.bytes_total == 2 * GIB
    assert h.gbps_mean == pytest.approx(2 * GIB / 0.06 / 1e9)


def test_bundled_connector_lines_give_exact_per_transfer_rates_and_the_lane() -> None:
    lines = [line(12.0 + i, 2.0, GIB) for i in range(99)]  # transfers of 10..108 ms
    lines.append(line(1002.0, 2.0, GIB, path="tcp"))  # one fell back to TCP: 1 s
    lines.append(line(50.0, 1.0, GIB, ok=False))  # a failed pull: not a transfer
    lines.append({"id": "y", "pull_ms": None, "bytes": 0, "ok": True})  # no pull recorded
    h = from_connector_records("pdbench", lines)
    assert h is not None and h.source == "connector_records" and h.transfers == 100
    assert h.lane == "ipc+tcp"  # both lanes carried bytes in this point
    assert h.transfer_ms is not None and h.transfer_ms.min == pytest.approx(10.0)
    assert h.transfer_ms.max == pytest.approx(1000.0)
    assert h.gbps is not None and h.gbps.min == pytest.approx(GIB / 1e9)  # the TCP one: 1 GiB in 1 s
    assert h.gbps.max == pytest.approx(GIB / 1e7)  # 1 GiB in 10 ms
    assert h.gbps.p99 < h.gbps.p50 < h.gbps.max
    total_ms = sum(10.0 + i for i in range(99)) + 1000.0
    assert h.gbps_mean == pytest.approx(100 * GIB / (total_ms * 1e6))
    assert from_connector_records("pdbench", [line(5.0, 5.0, GIB), line(3.0, 1.0, 0)]) is None


def test_report_shows_each_points_handoff_and_flags_a_descriptor_split(tmp_path: Path) -> None:
    """The report reads the section through its one model and shows it per point; a point whose
    NIXL transfers went one block-sized descriptor at a time is a finding."""
    fixture = Path(__file__).parents[1] / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
    run = tmp_path / "tiny-fp32-cpu-nixl-1p1d" / fixture.name
    shutil.copytree(fixture, run)
    healthy, split = NixlDecode(), NixlDecode()
    b1, b2 = healthy.text(), split.text()
    for _ in range(4):
        healthy.transfer(0.015, 4 * GIB, 77, 0.0011)
        split.transfer(0.51, 4 * GIB, 131_072, 0.44)
    sections = {1: from_nixl_scrapes([(b1, healthy.text())]), 4: from_nixl_scrapes([(b2, split.text())])}
    for conc, section in sections.items():
        assert section is not None
        (f,) = run.glob(f"concurrency_{conc}_*.json")
        f.write_text(json.dumps(json.loads(f.read_text()) | {"kv_handoff": section.model_dump(mode="json")}))
    (bad,) = run.glob("concurrency_1_*.json")  # a section of the wrong shape is noted, not shown
    report = build_report([run])
    (table,) = [t for t in report.sections if t.title == "KV handoff per point"]
    rows = {r[3]: dict(zip(table.headers, r, strict=True)) for r in table.rows}
    assert rows["1"]["Lane"] == "not proven" and rows["1"]["MiB each"] == "4,096.0"
    assert rows["1"]["Descriptors"] == "77" and rows["4"]["Descriptors"] == "131,072"
    assert rows["1"]["GB/s mean"] == f"{4 * GIB / 0.015 / 1e9:.2f}" and rows["4"]["Post"] == "86%"
    (finding,) = table.findings
    assert "C=4" in finding and "32 KiB per descriptor" in finding
    assert "## KV handoff per point" in output_md.render(report)
    bad.write_text(json.dumps(json.loads(bad.read_text()) | {"kv_handoff": {"connector": "nixl"}}))
    report = build_report([run])
    (table,) = [t for t in report.sections if t.title == "KV handoff per point"]
    assert [r[3] for r in table.rows] == ["4"]
    assert any("kv_handoff" in n and "its KV handoff is not shown" in n for n in report.notes)


def test_each_connector_is_read_where_its_entry_says(tmp_path: Path) -> None:
    """NIXL from the decode servers' scrapes of the point (prefill's are not transfers), the bundled
    connector from its lines in the proxy's records, Mooncake from nowhere (it exports no sizes)."""
    decode, prefill = NixlDecode(), NixlDecode()
    (tmp_path / "d0.before.prom").write_text(decode.text())
    (tmp_path / "p0.before.prom").write_text(prefill.text())
    decode.transfer(0.02, GIB, 64, 0.001)
    prefill.transfer(0.02, GIB, 64, 0.001)  # must not be counted
    (tmp_path / "d0.after.prom").write_text(decode.text())
    (tmp_path / "p0.after.prom").write_text(prefill.text())
    targets = [("p0", "prefill", "http://p"), ("d0", "decode", "http://d")]
    nixl = point_handoff("nixl", targets, tmp_path, [])
    assert nixl is not None and nixl.transfers == 1 and nixl.bytes_total == GIB
    records = [{"id": "a", "connector": line(12.0, 2.0, GIB, path="tcp")}, {"id": "b"}]
    bundled = point_handoff("pdbench", targets, tmp_path, records)
    assert bundled is not None and bundled.lane == "tcp" and bundled.transfers == 1
    assert point_handoff("mooncake", targets, tmp_path, records) is None
    assert point_handoff(None, targets, tmp_path, records) is None
    assert point_handoff("nixl", targets, None, records) is None  # nothing was scraped


def test_a_recorded_vllm_nixl_run_on_cpu() -> None:
    """vLLM 0.32's own scrapes of a 1P1D NIXL point (the tiny model on CPU, 28 requests), kept
    without their histogram buckets: the sums give the section, the percentiles are left out."""
    fix = Path(__file__).parents[1] / "fixtures" / "metrics" / "nixl-1p1d"
    h = from_nixl_scrapes([((fix / "decode.before.prom").read_text(), (fix / "decode.after.prom").read_text())])
    assert h is not None and h.transfers == 28
    assert h.bytes_total == 29_360_128 and h.bytes_per_transfer == 1 << 20  # one MiB per request
    assert h.gbps_mean == pytest.approx(29_360_128 / (0.097585 - 0.01754) / 1e9)  # 0.37 GB/s
    assert h.descriptors_per_transfer == pytest.approx(72 / 28)
    assert h.post_share == pytest.approx((0.052661 - 0.01754) / (0.097585 - 0.01754))
    assert h.transfer_ms is None and h.gbps is None


def test_the_log_line_says_count_size_rate_and_lane() -> None:
    h = from_connector_records("pdbench", [line(12.0, 2.0, GIB), line(22.0, 2.0, GIB)])
    assert h is not None
    assert describe(h) == (
        f"KV handoff: 2 transfers of 1,024.0 MiB, {2 * GIB / 30e6:.2f} GB/s mean "
        f"(p50 {(GIB / 10e6 + GIB / 20e6) / 2:.2f}, slow tail {h.gbps.p99:.2f}), lane ipc"  # type: ignore[union-attr]
    )
