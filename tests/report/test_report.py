"""pdbench report: loading every supported result format, the table, golden outputs, the plot."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.report import cells, output_csv, output_html, output_json, output_md, output_text
from harness.report.build import build_report
from harness.report.load import load_runs
from harness.report.normalise import per_gpu
from harness.report.pareto import pareto_front
from harness.report.pareto_plot import X_LABEL, Y_LABEL, figure, save
from harness.report.result_names import name_concurrency, name_gpus
from harness.rundir import Failure, FailureRecords, RunDir

FIXTURES = Path(__file__).parents[1] / "fixtures" / "results"
GOLDEN = Path(__file__).parents[1] / "golden" / "report"
TINY_1P1D = "tiny-fp32-cpu-nixl-1p1d/20261122T032441Z-e8da34"
TINY_1P2D = "tiny-fp32-cpu-nixl-1p2d/20261122T034324Z-a3eb41"
DSR1_A = "dsr1-fp8-2p4d/20261201T100000Z-aaa111"
DSR1_B = "dsr1-fp8-2p4d/20261202T100000Z-bbb222"
IX = "inferencex-dsr1-fp8-mi355x-isl_1024_osl_1024"

# case -> (runs, baseline)
CASES = {
    "pdbench": ([TINY_1P1D, TINY_1P2D], None),
    "pdbench-baseline": ([TINY_1P2D], TINY_1P1D),
    "dsr1-baseline": ([DSR1_B], DSR1_A),
    "vllm": (["vllm-serve"], None),
    "inferencex": ([IX], None),
    "srt-slurm": (["srt-slurm-4049", "srt-slurm-agg-4100"], None),
    "broken": (["broken"], None),
}
FORMATS = {"md": output_md, "csv": output_csv, "html": output_html, "json": output_json, "txt": output_text}


def _report(case: str):
    runs, baseline = CASES[case]
    return build_report([FIXTURES / r for r in runs], FIXTURES / baseline if baseline else None, root=FIXTURES)


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    # Goldens are rewritten only on purpose, by scripts/update_goldens.py, never by the suite.
    assert text == path.read_text(), f"{name} differs from {path} (see scripts/update_goldens.py)"


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str, fmt: str) -> None:
    _golden(f"{case}.{fmt}", FORMATS[fmt].render(_report(case)))


def test_cli_markdown_matches_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)
    r = CliRunner().invoke(app, ["report", DSR1_B, "--baseline", DSR1_A])
    assert r.exit_code == 0, r.output
    assert r.stdout == (GOLDEN / "dsr1-baseline.md").read_text()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_cli_out_and_plot(fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)
    out, png = tmp_path / f"report.{fmt}", tmp_path / "plots" / "pareto.png"
    # No --format: the extension of --out decides.
    r = CliRunner().invoke(app, ["report", "broken", "--out", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert out.read_text() == (GOLDEN / f"broken.{fmt}").read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # With --out the skipped files are also printed, so a CI log shows them.
    assert "skipped 7 file(s):" in r.stderr and "not valid JSON" in r.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["pareto.png", "plots", f"report.{fmt}"]


def test_cli_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "no such run directory" in r.stderr
    (tmp_path / "empty").mkdir()
    r = runner.invoke(app, ["report", str(tmp_path / "empty")])
    assert r.exit_code == 1
    assert "no result files (*.json) in this run directory" in r.stdout
    assert "no usable result files" in r.stderr


def test_recipe_name_resolves_to_its_latest_run() -> None:
    r = CliRunner().invoke(app, ["report", "dsr1-fp8-2p4d", "--results-dir", str(FIXTURES), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert [run["run"] for run in json.loads(r.stdout)["runs"]] == [DSR1_B]


def test_folder_of_runs_reads_each_run() -> None:
    report = build_report([FIXTURES / "dsr1-fp8-2p4d"], root=FIXTURES)
    assert [r.label for r in report.runs] == [DSR1_A, DSR1_B]
    assert "dsr1-fp8-2p4d: a folder of runs: read as 2 runs" in report.notes
    assert not report.skipped


# --- loading --------------------------------------------------------------------------------------


def test_every_source_format_is_recognised() -> None:
    loaded = load_runs([FIXTURES / r for r in (TINY_1P1D, DSR1_A, "vllm-serve", IX, "srt-slurm-4049")])
    assert {r.label: sorted({p.source for p in r.points}) for r in loaded.runs} == {
        TINY_1P1D: ["pdbench"],
        DSR1_A: ["pdbench"],
        "vllm-serve": ["vllm"],
        IX: ["inferencex"],
        "srt-slurm-4049": ["srt-slurm"],
    }


def test_skipped_files_are_listed_with_reasons() -> None:
    report = _report("broken")
    got = {report.rel(s.path): s.reason for s in report.skipped}
    expected = {
        "concurrency_1_req_rate_inf_gpus_2_ctx_1_gen_1.json": "not valid JSON",
        "concurrency_2_req_rate_inf_gpus_2_ctx_1_gen_1.json": "the JSON is list, not an object",
        "concurrency_4_req_rate_inf_gpus_2_ctx_1_gen_1.json": "missing key output_throughput",
        "concurrency_8_req_rate_inf_gpus_2_ctx_1_gen_1.json": "total_token_throughput is not a finite",
        "concurrency_16_req_rate_inf_gpus_2_ctx_1_gen_1.json": "exceeds total_token_throughput",
        "results.json": "no concurrency",
        "RESULT_FILENAME_concurrency_64_req_rate_inf_gpus_2_ctx_1_gen_1.json": "duplicate of concurrency_64_req_rate_inf_gpus_2_ctx_1_gen_1.json",
    }
    assert {Path(k).name for k in got} == set(expected)
    for name, reason in expected.items():
        assert reason in got[f"broken/{name}"], (name, got[f"broken/{name}"])
    # The one good file is used, and the failed run is said.
    assert list(report.table["conc"]) == [64]
    assert "broken: run state failed (decode-0 exited with code 1 during the sweep)" in report.notes
    md = output_md.render(report)
    assert "## Skipped files (7)" in md
    assert all(f"`broken/{name}`" in md for name in expected)


def test_sidecars_rollups_and_job_metadata_are_listed_not_read() -> None:
    report = build_report([FIXTURES / "vllm-serve", FIXTURES / "srt-slurm-4049"], root=FIXTURES)
    got = {Path(s.path).name: s.reason for s in report.skipped}
    assert got == {
        "vllm-infqps-concurrency8-Llama-3.1-8B-Instruct-20261120-101500.pytorch.json": "PyTorch-benchmark sidecar of a result, not a result",
        "vllm-infqps-concurrency32-Llama-3.1-8B-Instruct-20261120-101500.pytorch.json": "PyTorch-benchmark sidecar of a result, not a result",
        "4049.json": "missing key total_token_throughput (nor total_throughput), not a benchmark result",
    }


def test_empty_and_unreadable(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "concurrency_1_gpus_2_ctx_1_gen_1.json").write_bytes(b"\xff\xfe\x00garbage")
    report = build_report([tmp_path / "run"], root=tmp_path)
    assert [(report.rel(s.path), s.reason) for s in report.skipped] == [
        ("run/concurrency_1_gpus_2_ctx_1_gen_1.json", "not a text file")
    ]
    assert report.table.empty and "run: no usable result files" in report.notes


@pytest.mark.parametrize(
    "name, conc, gpus",
    [
        ("concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32", 64, (48, 16, 32)),
        ("results_concurrency_16_gpus_24_ctx_8_gen_16", 16, (24, 8, 16)),
        ("results_concurrency_32_gpus_8", 32, (8, None, None)),
        ("results_concurrency_16", 16, (None, None, None)),
        ("dsr1_conc128_gpus_24_ctx_8_gen_16", 128, (24, 8, 16)),
        ("exp_c256_gpus_9_ctx_1_gen_8", 256, (9, 1, 8)),
        ("vllm-infqps-concurrency8-Llama-3.1-8B-Instruct-20261120-101500", 8, (None, None, None)),
        # InferenceX's RESULT_FILENAME prefix has its own conc8x32 token and -tp8- parts.
        (
            "dsr1_prefill-tp8-nw1_decode-tp8-nw2_conc8x32_runner_concurrency_32_req_rate_inf_gpus_24_ctx_8_gen_16",
            32,
            (24, 8, 16),
        ),
        ("plan", None, (None, None, None)),
    ],
)
def test_file_name_variants(name: str, conc: int | None, gpus: tuple) -> None:
    assert name_concurrency(name) == conc
    assert name_gpus(name) == gpus


def test_key_aliases_and_legacy_percentiles() -> None:
    run = load_runs([FIXTURES / "srt-slurm-4049"]).runs[0]
    legacy = next(p for p in run.points if p.concurrency == 64)
    assert (legacy.isl, legacy.osl) == (8192, 1024)  # from logs/sa-bench_isl_8192_osl_1024/
    assert legacy.ms["p99_ttft_ms"] == 4000.0 and legacy.ms["p99.9_ttft_ms"] == 5000.0
    assert legacy.ms["p90_ttft_ms"] == 3000.0 and legacy.ms["p99_e2el_ms"] == 40000.0
    assert (legacy.prefill_gpus, legacy.decode_gpus, legacy.gpus_from) == (8, 16, "file name")
    assert (legacy.failed, legacy.failed_derived) == (0, True)


def test_inferencex_without_failed_key() -> None:
    run = load_runs([FIXTURES / IX]).runs[0]
    p8 = next(p for p in run.points if p.concurrency == 8)
    assert (p8.completed, p8.failed, p8.failed_derived) == (78, 2, True)  # num_prompts 80
    assert (p8.isl, p8.osl) == (1024, 1024)  # from the run directory's name
    assert p8.source == "inferencex"


def test_metadata_gpus_win_over_the_file_name(tmp_path: Path) -> None:
    src = FIXTURES / DSR1_A / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json"
    (tmp_path / "r").mkdir()
    shutil.copy(src, tmp_path / "r" / "concurrency_64_req_rate_inf_gpus_16_ctx_8_gen_8.json")
    report = build_report([tmp_path / "r"], root=tmp_path)
    assert (report.table["prefill_gpus"][0], report.table["decode_gpus"][0]) == (16, 32)
    assert any("differs from the metadata's (prefill 16, decode 32)" in n for n in report.notes)


def test_point_that_ended_early_is_said(tmp_path: Path) -> None:
    d = json.loads((FIXTURES / DSR1_A / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").read_text())
    d["stop_reason"] = "point timeout after 600 s"
    d["goodput_slos_ms"] = {"ttft": 200.0}  # ends in "ms" but is no latency: not read as one
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").write_text(json.dumps(d))
    report = build_report([tmp_path / "r"], root=tmp_path)
    assert "r: conc 64 ended before every request was done: point timeout after 600 s" in report.notes
    assert "goodput_slos_ms" not in load_runs([tmp_path / "r"]).runs[0].points[0].ms
    # With the requests the stop kept from being sent: counted apart from the failed ones.
    d["not_sent"] = 12
    (tmp_path / "r" / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").write_text(json.dumps(d))
    report = build_report([tmp_path / "r"], root=tmp_path)
    assert "r: conc 64 ended before every request was done (12 never sent): point timeout after 600 s" in report.notes


def _copy_run(tmp_path: Path) -> Path:
    run = tmp_path / "dsr1" / "run"
    shutil.copytree(FIXTURES / DSR1_A, run)
    return run


def test_a_run_killed_before_its_status_is_read_from_its_failure_records(tmp_path: Path) -> None:
    run = _copy_run(tmp_path)
    rundir = RunDir(run)
    rundir.status.unlink()
    assert "run: no status.json (the run did not finish)" in build_report([run], root=tmp_path).notes
    FailureRecords(rundir).record(Failure(node=1, cause="was killed by Slurm"))
    report = build_report([run], root=tmp_path)
    assert "run: run state failed (node 1: was killed by Slurm)" in report.notes
    assert [s["state"] for s in json.loads(output_json.render(report))["runs"]] == ["failed"]


def test_unreadable_status_is_listed_and_control_files_are_not_results(tmp_path: Path) -> None:
    run = _copy_run(tmp_path)
    rundir = RunDir(run)
    rundir.status.write_text("[1, 2]")
    rundir.launch_record.write_text("{}")  # the launcher's record: never read as a result
    report = build_report([run], root=tmp_path)
    assert [(report.rel(s.path), s.reason) for s in report.skipped] == [
        ("dsr1/run/status.json", "status.json unreadable (not an object); run state unknown")
    ]
    assert len(report.table) == 3 and not any("state" in n for n in report.notes)


# --- table ---------------------------------------------------------------------------------------


def test_per_gpu_formulas() -> None:
    assert per_gpu(48000.0, 6000.0, 16, 32) == (1000.0, 187.5, 2625.0)
    assert per_gpu(16000.0, 8000.0, 8, 0) == (2000.0, 1000.0, 1000.0)  # D = 0: output over P+D
    assert all(math.isnan(v) for v in per_gpu(1.0, 1.0, None, None))


def test_baseline_deltas() -> None:
    t = _report("dsr1-baseline").table
    cand = t[~t["baseline"]].set_index("conc")
    assert cand.loc[64, "tput_per_gpu_delta"] == pytest.approx(100.0)
    assert cand.loc[64, "tput_per_gpu_pct"] == pytest.approx(10.0)
    assert cand.loc[64, "median_ttft_ms_delta"] == pytest.approx(-40.0)
    assert cand.loc[64, "median_ttft_ms_pct"] == pytest.approx(-10.0)
    assert cand.loc[64, "intvty_delta"] == pytest.approx(10.0) and cand.loc[64, "intvty_pct"] == pytest.approx(25.0)
    assert cand.loc[256, "failed_delta"] == -3 and cand.loc[256, "failed_pct"] == pytest.approx(-100.0)
    assert math.isnan(cand.loc[128, "failed_pct"])  # 0 -> 0: no percentage of zero
    assert math.isnan(cand.loc[512, "tput_per_gpu_delta"])  # no baseline point at 512
    assert t[t["baseline"]]["tput_per_gpu_delta"].isna().all()


def test_invalid_points_are_marked() -> None:
    report = _report("dsr1-baseline")
    row = report.table[report.table["baseline"] & (report.table["conc"] == 256)].iloc[0]
    assert not row["valid"] and "kv_transferred" in row["validity_reasons"]
    md = output_md.render(report)
    line = next(line for line in md.splitlines() if "(baseline) | 8192 | 1024 | 256 |" in line)
    assert "⚠️ **INVALID**" in line
    html = output_html.render(report)
    assert html.count('<tr class="baseline invalid">') == 1 and html.count('class="invalid-flag"') == 1
    assert any("compared with an INVALID baseline point" in n for n in report.notes)
    assert json.loads(output_json.render(report))["rows"][4]["valid"] is False


def test_unverified_points_are_marked(tmp_path: Path) -> None:
    # The writer's representation (valid null, verdict unverified), and a pdbench point with no verdict.
    d = json.loads((FIXTURES / DSR1_A / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").read_text())
    d["metadata"].update(
        valid=None, validity={"verdict": "unverified", "valid": None, "reasons": ["no server /metrics were scraped"]}
    )
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "concurrency_64_req_rate_inf_gpus_48_ctx_16_gen_32.json").write_text(json.dumps(d))
    report = build_report([tmp_path / "r", FIXTURES / "vllm-serve"], root=tmp_path)
    rows = {r["source"]: r for _, r in report.table.iterrows()}
    assert rows["pdbench"]["verdict"] == "unverified" and cells.missing(rows["pdbench"]["valid"])
    assert rows["pdbench"]["validity_reasons"] == "no server /metrics were scraped"
    assert cells.missing(rows["vllm"]["verdict"])  # another tool's file: no notion of validity
    md = output_md.render(report)
    assert "| 64 | 640 | 16+32 | unverified |" in md and "| 8 | 80 | n/a | – |" in md
    assert any(n.startswith("r: UNVERIFIED: no evidence") for n in report.notes)
    assert 'class="unverified-flag"' in output_html.render(report)


# --- plot ----------------------------------------------------------------------------------------


def test_pareto_front() -> None:
    pts = [(50.0, 1100.0), (25.0, 1500.0), (20.0, 1400.0), (12.5, 2300.0), (30.0, 1000.0), (math.nan, 5.0)]
    assert pareto_front(pts) == [(12.5, 2300.0), (25.0, 1500.0), (50.0, 1100.0)]


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_plot_data_labels_and_legend() -> None:
    report = _report("dsr1-baseline")
    ax = figure(report).axes[0]
    lines = _lines(ax)
    base, cand = lines[f"{DSR1_A} (baseline)"], lines[DSR1_B]
    # Baseline: the invalid c256 point is a cross, off the line.
    assert list(base.get_xdata()) == [25.0, 40.0] and list(base.get_ydata()) == [1500.0, 1000.0]
    assert list(cand.get_xdata()) == [12.5, 20.0, 25.0, 50.0]
    assert list(cand.get_ydata()) == [2300.0, 2100.0, 1500.0, 1100.0]
    crosses = [line for line in ax.get_lines() if line.get_marker() == "x" and len(line.get_xdata())]
    assert [(list(c.get_xdata()), list(c.get_ydata())) for c in crosses] == [([15.625], [2000.0])]
    assert ax.get_xlabel() == X_LABEL and ax.get_ylabel() == Y_LABEL
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        f"{DSR1_A} (baseline)",
        DSR1_B,
        "invalid point (off the line)",
    ]
    assert ax.get_title() == "Throughput per GPU vs interactivity (ISL 8192, OSL 1024)"
    assert sorted(t.get_text() for t in ax.texts) == sorted(["c64", "c128", "c256", "c64", "c128", "c256", "c512"])


def test_plot_real_runs_one_line_each_and_png(tmp_path: Path) -> None:
    report = _report("pdbench")
    png = tmp_path / "pareto.png"
    fig = save(report, png)
    lines = _lines(fig.axes[0])
    for label, run in ((TINY_1P1D, TINY_1P1D), (TINY_1P2D, TINY_1P2D)):
        rows = report.table[report.table["run"] == run]
        front = pareto_front(list(zip(rows["intvty"], rows["tput_per_gpu"], strict=False)))
        assert list(zip(lines[label].get_xdata(), lines[label].get_ydata(), strict=False)) == front
    import matplotlib.image

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(png).shape == (600, 900, 4)


def test_plot_mixed_isl_osl_labels_each_pair() -> None:
    report = build_report(
        [FIXTURES / "srt-slurm-4049", FIXTURES / "srt-slurm-agg-4100", FIXTURES / "vllm-serve"], root=FIXTURES
    )
    labels = [t.get_text() for t in figure(report).axes[0].get_legend().get_texts()]
    assert labels == [
        "srt-slurm-4049 [ISL 8192 / OSL 1024]",
        "srt-slurm-agg-4100 [ISL 1024 / OSL 1024]",
        "vllm-serve [ISL n/a / OSL n/a] (no plottable point)",
    ]
