"""The report's bottleneck table from the results' `bottleneck` sections, read through their one
model: each point's verdict and evidence, and one line per sweep saying where the limit moves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.report import output_md
from harness.report.bottleneck import limit_line
from harness.report.build import build_report
from harness.report.load import load_runs
from harness.rundir.bottleneck_summary import Baseline, RoleTiming
from harness.validity.bottleneck import judge

pytestmark = pytest.mark.timeout(60)

FIXTURE = Path(__file__).parent / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
CLIENT = {"cpu_busy": [0.3], "loop_lag_ms": {"median": 0.1, "p99": 0.4}, "warnings": []}
LOW_ROLES = {
    "prefill": RoleTiming(requests=12, queue_ms=0.4, compute_ms=48.0, tpot_ms=0.0),
    "decode": RoleTiming(requests=12, queue_ms=25.0, compute_ms=19.0, tpot_ms=12.8),
}
HIGH_ROLES = LOW_ROLES | {"prefill": RoleTiming(requests=36, queue_ms=30.0, compute_ms=141.0, tpot_ms=0.0)}
PARTS = {"ttft_ms": 128.0, "router_ms": 0.4, "prefill_ms": 66.0, "decode_ms": 61.0, "client_ms": 0.6}


def _sections() -> tuple[dict, dict]:
    low = judge(PARTS, LOW_ROLES, 14.0, 12.0, CLIENT, None, e2el_ms=500.0)
    base = Baseline(concurrency=1, roles=LOW_ROLES, kv_transfer_ms=14.0)
    high_parts = PARTS | {"ttft_ms": 329.0, "prefill_ms": 245.0, "decode_ms": 83.0}
    high = judge(high_parts, HIGH_ROLES, 9.0, 14.0, CLIENT, base, e2el_ms=763.0)
    return low.model_dump(mode="json"), high.model_dump(mode="json")


def _run(tmp_path: Path, sections: dict[int, object]) -> Path:
    run = tmp_path / "tiny-fp32-cpu-nixl-1p1d" / FIXTURE.name
    shutil.copytree(FIXTURE, run)
    for conc, section in sections.items():
        (f,) = run.glob(f"concurrency_{conc}_*.json")
        f.write_text(json.dumps(json.loads(f.read_text()) | {"bottleneck": section}))
    return run


def test_each_points_verdict_and_where_the_sweeps_limit_moves(tmp_path: Path) -> None:
    low, high = _sections()
    report = build_report([_run(tmp_path, {1: low, 4: high})])
    (table,) = [t for t in report.sections if t.title == "Bottleneck per point"]
    rows = [dict(zip(table.headers, r, strict=True)) for r in table.rows]
    assert [(r["Conc"], r["Verdict"], r["Dominant"]) for r in rows] == [
        ("1", "not saturated", "prefill 52%"),
        ("4", "prefill-bound", "prefill 74%"),
    ]
    assert rows[0]["Prefill queue/compute"] == "0.4/48.0" and rows[0]["Why"] == "no rule fired"
    assert rows[1]["Prefill queue/compute"] == "30.0/141.0 (3.5x)" and rows[1]["KV transfer"] == "9.0 (0.6x)"
    assert "grew 3.5x over C=1" in rows[1]["Why"] and rows[1]["Client CPU"] == "30%"
    assert table.findings == (
        f"{report.runs[0].label} (disagg, ISL {rows[0]['ISL']}, OSL {rows[0]['OSL']}): "
        "not saturated at C=1; prefill-bound from C=4",
    )
    md = output_md.render(report)
    assert "## Bottleneck per point" in md and "prefill-bound from C=4" in md


def test_limit_line_spans_and_a_steady_sweep(tmp_path: Path) -> None:
    low, high = _sections()
    (run,) = load_runs([_run(tmp_path, {1: low, 4: high})]).runs
    points = sorted(run.points, key=lambda p: p.concurrency)
    assert limit_line(run, points[:1]) is None  # one point: nothing moves
    points[1].bottleneck = points[0].bottleneck
    line = limit_line(run, points)
    assert line is not None and line.endswith("not saturated at every concurrency (C=1–4)")


def test_a_breakdown_that_does_not_add_up_is_a_finding(tmp_path: Path) -> None:
    low, high = _sections()
    run = _run(tmp_path, {1: low, 4: high})
    (f,) = run.glob("concurrency_4_*.json")
    adds_up = {"within": 0.02, "requests": 9, "of": 10, "share": 0.9}
    f.write_text(json.dumps(json.loads(f.read_text()) | {"ttft_breakdown": {"requests": 10, "adds_up": adds_up}}))
    (table,) = [t for t in build_report([run]).sections if t.title == "Bottleneck per point"]
    assert table.findings[-1].endswith(
        "C=4): the TTFT parts add up within 2% for 9 of 10 requests (90%; the bar is 95%)"
    )
    assert len(table.findings) == 2  # the sweep's line, then this


def test_a_malformed_section_is_named_and_left_out(tmp_path: Path) -> None:
    low, _ = _sections()
    report = build_report([_run(tmp_path, {1: low | {"verdict": "gpu-bound"}})])
    assert not [t for t in report.sections if t.title == "Bottleneck per point"]
    (note,) = [n for n in report.notes if "bottleneck" in n]
    assert "bottleneck.verdict" in note and "its bottleneck verdict is not shown" in note
