"""The report's table of profiled points: the perturbation beside the point, from a sweep's
real results (the fake server with vLLM's profiler endpoints of tests/bench/test_profile.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.profile_fakes import ProfiledFake, profiled_sweep

from harness import tiny_model
from harness.report import output_md
from harness.report.build import build_report
from harness.rundir.profile_summary import capture_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


def test_the_report_shows_the_perturbation_beside_the_profiled_point(model_dir: str, tmp_path: Path) -> None:
    srv = ProfiledFake(tmp_path / capture_dir("decode-0"))
    with srv:
        results = profiled_sweep(model_dir, tmp_path, srv)
    ratios = results[2]["profile"]["perturbation"]
    report = build_report([tmp_path])
    (table,) = [t for t in report.sections if t.title == "Profiled points"]
    (row,) = table.rows  # C=2 only
    cells = dict(zip(table.headers, row, strict=True))
    assert cells["Conc"] == "2" and cells["Tool"] == "torch" and cells["Problems"] == "–"
    assert cells["TTFT x"] == f"{ratios['median_ttft_ms']:.2f}" and cells["TPOT x"] == f"{ratios['median_tpot_ms']:.2f}"
    assert cells["Traces"] == "decode-0 1"
    prof = results[2]["profile"]
    expected = f"{prof['profiled']['output_throughput']:.1f} / {prof['unprofiled']['output_throughput']:.1f}"
    assert cells["Out tok/s profiled/unprofiled"] == expected
    assert "Profiled points" in output_md.render(report)
