"""The report's bottleneck table from the results' `bottleneck` sections, read through their one
model: each point's verdict and evidence, and one line per sweep saying where the limit moves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.bottleneck_runs import bottleneck_run, bottleneck_sections

from harness.report import output_md
from harness.report.bottleneck import limit_line
from harness.report.build import build_report
from harness.report.load import load_runs

pytestmark = pytest.mark.timeout(60)


def test_each_points_verdict_and_where_the_sweeps_limit_moves(tmp_path: Path) -> None:
    low, high = bottleneck_sections()
    report = build_report([bottleneck_run(tmp_path, {1: low, 4: high})])
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
    low, high = bottleneck_sections()
    (run,) = load_runs([bottleneck_run(tmp_path, {1: low, 4: high})]).runs
    points = sorted(run.points, key=lambda p: p.concurrency)
    assert limit_line(run, points[:1]) is None  # one point: nothing moves
    points[1].bottleneck = points[0].bottleneck
    line = limit_line(run, points)
    assert line is not None and line.endswith("not saturated at every concurrency (C=1–4)")


def test_a_breakdown_that_does_not_add_up_is_a_finding(tmp_path: Path) -> None:
    low, high = bottleneck_sections()
    run = bottleneck_run(tmp_path, {1: low, 4: high})
    (f,) = run.glob("concurrency_4_*.json")
    adds_up = {"within": 0.02, "requests": 9, "of": 10, "share": 0.9}
    f.write_text(json.dumps(json.loads(f.read_text()) | {"ttft_breakdown": {"requests": 10, "adds_up": adds_up}}))
    (table,) = [t for t in build_report([run]).sections if t.title == "Bottleneck per point"]
    assert table.findings[-1].endswith(
        "C=4): the TTFT parts add up within 2% for 9 of 10 requests (90%; the bar is 95%)"
    )
    assert len(table.findings) == 2  # the sweep's line, then this


def test_a_malformed_section_is_named_and_left_out(tmp_path: Path) -> None:
    low, _ = bottleneck_sections()
    report = build_report([bottleneck_run(tmp_path, {1: low | {"verdict": "gpu-bound"}})])
    assert not [t for t in report.sections if t.title == "Bottleneck per point"]
    (note,) = [n for n in report.notes if "bottleneck" in n]
    assert "bottleneck.verdict" in note and "its bottleneck verdict is not shown" in note
