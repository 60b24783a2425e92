"""The report's cross-check table: pdbench's points beside `vllm bench serve`'s on the same servers
(clients/vllm/conc_<C>/ of the run directory), agreement on TPOT and throughput within noise, and
TTFT explained by which client was CPU-bound."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from harness.report import output_html, output_json, output_md, output_text
from harness.report.build import build_report
from harness.report.crosscheck import NOISE, allowance
from harness.report.model import Report, SectionTable
from harness.rundir.paths import CLIENT_RUN, VLLM_BENCH_RESULT, RunDir

pytestmark = pytest.mark.timeout(60)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
TITLE = "Cross-check: pdbench vs vllm bench serve (same servers)"


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "tiny-fp32-cpu-nixl-1p1d" / FIXTURE.name
    shutil.copytree(FIXTURE, run)
    return run


def _pdbench(run: Path, conc: int) -> dict:
    (f,) = run.glob(f"concurrency_{conc}_*.json")
    return json.loads(f.read_text())


def _set_client(run: Path, conc: int, busy: list[float]) -> None:
    (f,) = run.glob(f"concurrency_{conc}_*.json")
    data = json.loads(f.read_text())
    data["client"] = {
        "workers": 1,
        "cpu_busy": busy,
        "loop_lag_ms": {"median": 0.1, "p99": 1, "max": 2},
        "warnings": [],
    }
    f.write_text(json.dumps(data))


def _vllm(run: Path, conc: int, tpot: float, tput: float, ttft: float, cpu_share: float, rc: int = 0) -> None:
    """What `vllm bench serve --save-result` writes (the keys the report reads), and the run record."""
    point = RunDir(run).client_point("vllm", conc)
    point.mkdir(parents=True)
    result = {
        "backend": "openai",
        "max_concurrency": conc,
        "num_prompts": 16,
        "completed": 16,
        "failed": 0,
        "total_token_throughput": tput * 9,
        "output_throughput": tput,
        "mean_tpot_ms": tpot,
        "median_tpot_ms": tpot,
        "std_tpot_ms": tpot * 0.05,
        "median_ttft_ms": ttft,
        "mean_ttft_ms": ttft,
        "std_ttft_ms": ttft * 0.05,
        "mean_e2el_ms": ttft + 31 * tpot,
        "std_e2el_ms": (ttft + 31 * tpot) * 0.05,
        "p99_ttft_ms": ttft * 2,
        "median_e2el_ms": ttft + 31 * tpot,
        "random_input_len": 256,
        "random_output_len": 32,
    }
    (point / VLLM_BENCH_RESULT).write_text(json.dumps(result))
    (point / CLIENT_RUN).write_text(json.dumps({"returncode": rc, "wall_s": 10.0, "cpu_s": 10.0 * cpu_share}))


def _section(report: Report, title: str = TITLE) -> SectionTable:
    (t,) = [s for s in report.sections if s.title == title]
    return t


def test_agreeing_clients_and_a_cpu_bound_one_explained(tmp_path: Path) -> None:
    run = _run(tmp_path)
    one, four = _pdbench(run, 1), _pdbench(run, 4)
    # C=1: vLLM's client agrees on TPOT and throughput (within noise) and on TTFT.
    _vllm(run, 1, one["mean_tpot_ms"] * 1.03, one["output_throughput"] * 0.97, one["median_ttft_ms"], 0.35)
    # C=4: same TPOT and throughput, but vLLM's client was CPU-bound and its TTFT is 60 % higher.
    _set_client(run, 4, [0.41])
    _vllm(run, 4, four["mean_tpot_ms"], four["output_throughput"] * 1.02, four["median_ttft_ms"] * 1.6, 0.97)
    report = build_report([run])
    t = _section(report)
    assert [r[2] for r in t.rows] == ["1", "4"]
    by_conc = {r[2]: dict(zip(t.headers, r, strict=True)) for r in t.rows}
    assert by_conc["1"]["Agree"] == by_conc["4"]["Agree"] == "yes"
    assert by_conc["1"]["TPOT diff"] == "+3%" and by_conc["1"]["Tput diff"] == "-3%"
    assert by_conc["4"]["Client CPU vllm"] == "97%" and by_conc["4"]["Client CPU pdbench"] == "41%"
    (finding,) = t.findings
    assert finding.startswith("tiny-fp32-cpu-nixl-1p1d/20261122T032441Z-e8da34 disagg C=4: TTFT p50 differs by +60%")
    assert "vLLM's client was CPU-bound" in finding and "pdbench's 41% by its client section" in finding
    # Every output says it.
    md = output_md.render(report)
    assert f"## {TITLE}" in md and "⚠️ tiny-fp32-cpu-nixl-1p1d" in md and "TTFT is shown, not judged" in md
    assert TITLE in output_text.render(report, width=200) and "CPU-bound" in output_text.render(report, width=200)
    assert f"<h2>{TITLE}</h2>" in output_html.render(report)
    doc = json.loads(output_json.render(report))
    assert doc["sections"][0]["title"] == TITLE and len(doc["sections"][0]["rows"]) == 2


def test_a_disagreement_beyond_noise_is_said(tmp_path: Path) -> None:
    run = _run(tmp_path)
    one = _pdbench(run, 1)
    _vllm(run, 1, one["mean_tpot_ms"] * 2.0, one["output_throughput"], one["median_ttft_ms"], 0.3)
    t = _section(build_report([run]))
    (row,) = t.rows
    assert dict(zip(t.headers, row, strict=True))["Agree"] == "no"
    (finding,) = t.findings
    assert re.search(r"C=1: TPOT mean differs by \+100% \(allowed: \d+%\), beyond noise$", finding), finding


def test_a_failed_vllm_point_is_listed_not_compared(tmp_path: Path) -> None:
    run = _run(tmp_path)
    point = RunDir(run).client_point("vllm", 4)
    point.mkdir(parents=True)
    (point / CLIENT_RUN).write_text(json.dumps({"returncode": 1, "wall_s": 3.0, "cpu_s": 2.0}))
    t = _section(build_report([run]))
    (row,) = t.rows
    assert row[2] == "4" and row[-1] == "n/a"
    assert t.findings == (
        "tiny-fp32-cpu-nixl-1p1d/20261122T032441Z-e8da34 disagg C=4: not compared, vllm bench serve wrote "
        "no readable result (it exited with code 1)",
    )


def test_no_cross_check_no_table_and_client_files_are_not_results(tmp_path: Path) -> None:
    run = _run(tmp_path)
    report = build_report([run])
    assert report.sections == [] and "Cross-check" not in output_md.render(report)
    one = _pdbench(run, 1)
    _vllm(run, 1, one["mean_tpot_ms"], one["output_throughput"], one["median_ttft_ms"], 0.3)
    report = build_report([run])
    # vLLM's file is the cross-check's, never a second point of the run's own table.
    assert len(report.table) == 2 and set(report.table["source"]) == {"pdbench"}
    assert not [s for s in report.skipped if "clients" in str(s.path)]


def test_vllm_client_cpu_is_taken_over_its_measured_window() -> None:
    """Start-up (importing vLLM) is CPU-heavy and not the measurement: the share is the last
    `duration` seconds' CPU per second, interpolated between the once-a-second samples."""
    from harness.report.client_points import window_share

    # 20 s of start-up at one core, then 10 s measured at half a core.
    timeline = [[float(t), float(min(t, 20) + max(0, t - 20) * 0.5)] for t in range(31)]
    assert window_share(timeline, 10.0) == pytest.approx(0.5)
    assert window_share(timeline, 15.0) == pytest.approx((25 - 15) / 15)  # 5 s of start-up in the window
    assert window_share(timeline, None) is None and window_share(timeline[:1], 5.0) is None


def test_the_allowance_grows_with_the_points_own_spread(tmp_path: Path) -> None:
    """Few requests with a wide spread cannot tell 15 % apart: the allowance is 3 standard errors
    of the difference of the means when that is more than 10 %."""
    run = _run(tmp_path)
    one = _pdbench(run, 1)
    _vllm(run, 1, one["mean_tpot_ms"] * 1.15, one["output_throughput"], one["median_ttft_ms"], 0.3)
    report = build_report([run])
    (ours,) = [p for p in report.runs[0].points if p.concurrency == 1]
    from harness.report.client_points import vllm_points

    (theirs,) = vllm_points(report.runs[0], [])
    assert theirs.point is not None
    wide = allowance(ours, theirs.point, "tpot")
    se = lambda p: p.ms["std_tpot_ms"] / p.completed**0.5 / p.ms["mean_tpot_ms"]  # noqa: E731
    assert wide == pytest.approx(max(NOISE, 3 * (se(ours) ** 2 + se(theirs.point) ** 2) ** 0.5))
