"""`pdbench report` and `collect` over results that checked their outputs: the sentinel match per
point in every format, the match rate in sweep order with its fall, the accuracy evals beside their
thresholds, the aggregated baseline and the before-sweep score, and `collect` leaving out points
that failed outputs_match. Run directories are built in tmp dirs in the writers' formats."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from helpers.outputs_check_runs import (
    DSR1_A,
    NAME,
    edit_result,
    outputs_check_run,
    outputs_rule,
    sentinel_section,
    write_eval_summary,
)
from typer.testing import CliRunner

from harness.cli import app
from harness.report import cells, output_csv, output_html, output_json, output_md
from harness.report.accuracy import compare
from harness.report.build import build_report
from harness.report.collect import collect
from harness.rundir import RunDir
from harness.rundir.sentinel_summary import Tolerance

# --- the points table ------------------------------------------------------------------------


def test_points_table_shows_each_points_match_in_every_format(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    report = build_report([run], root=tmp_path)
    assert [s.path.name for s in report.skipped] == []  # the sentinel records were not read as results
    rows = {r["conc"]: r for _, r in report.table.iterrows()}
    assert sorted(rows) == [64, 128, 256]
    assert rows[64]["outputs"] == "4/4" and rows[64]["outputs_match_rate"] == 1.0
    assert rows[128]["outputs"] == "3/4 (first divergence at token 17)"
    assert rows[128]["outputs_match_rate"] == 0.75 and rows[128]["verdict"] == "invalid"

    md = output_md.render(report)
    assert "| Valid | Outputs |" in md
    line = next(line for line in md.splitlines() if "| 128 | 1280 | 16+32 |" in line)
    assert "⚠️ **INVALID** | 3/4 (first divergence at token 17) |" in line
    html = output_html.render(report)
    assert "<th>Outputs</th>" in html and "<td>3/4 (first divergence at token 17)</td>" in html
    table = list(csv.DictReader(io.StringIO(output_csv.render(report))))
    assert {r["conc"]: (r["outputs"], r["outputs_match_rate"]) for r in table} == {
        "64": ("4/4", "1.0"),
        "128": ("3/4 (first divergence at token 17)", "0.75"),
        "256": ("4/4", "1.0"),
    }
    doc = json.loads(output_json.render(report))
    assert {r["conc"]: r["outputs"] for r in doc["rows"]} == {64: "4/4", 128: rows[128]["outputs"], 256: "4/4"}
    assert any("conc 128 is INVALID: outputs_match: sentinel 2 diverged at token 17" in n for n in report.notes)


def test_unanswered_tolerated_and_unchecked_points_say_so(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    # 256: one of 4 not answered; 64: a tolerance of the first 8 tokens let a divergence at 12 pass.
    edit_result(run, 256, sentinels=sentinel_section(256, [None, None, None], unanswered=1))
    tolerance = Tolerance(match_tokens=8, max_diverged=0)
    tolerated = sentinel_section(64, [None, 12, None, None], matched=4, match_rate=1.0, tolerance=tolerance)
    edit_result(run, 64, sentinels=tolerated)
    report = build_report([run], root=tmp_path)
    rows = {r["conc"]: r["outputs"] for _, r in report.table.iterrows()}
    assert rows[256] == "3/3 (1 of 4 unanswered)"
    assert rows[64] == "4/4 (3 exact; first divergence at token 12)"
    # Nothing answered: no rate. A point with the rule but no sentinels: the rule's status.
    edit_result(run, 256, sentinels=sentinel_section(256, [], unanswered=4))
    d = edit_result(run, 64, sentinels=None)
    d["metadata"]["validity"] = {
        "verdict": "valid",
        "valid": True,
        "reasons": [],
        "rules": [outputs_rule(None, "not_checked")],
    }
    (run / NAME.format(64)).write_text(json.dumps(d))
    report = build_report([run], root=tmp_path)
    rows = {r["conc"]: r for _, r in report.table.iterrows()}
    assert rows[256]["outputs"] == "0/4 answered" and math.isnan(rows[256]["outputs_match_rate"])
    assert rows[64]["outputs"] == "not checked"


def test_a_malformed_sentinels_block_is_named_and_the_point_kept(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    edit_result(run, 64, sentinels=sentinel_section(64, [None] * 4) | {"first_divergence": "17"})
    # Counts that cannot be: more compared than answered.
    edit_result(run, 256, sentinels=sentinel_section(256, [None] * 4) | {"answered": 3})
    report = build_report([run], root=tmp_path)
    assert sorted(report.table["conc"]) == [64, 128, 256]
    note = next(n for n in report.notes if NAME.format(64) in n)
    assert "sentinels.first_divergence: Input should be a valid tuple ('17')" in note
    assert "outputs check is not shown" in note
    note = next(n for n in report.notes if NAME.format(256) in n)
    assert "sentinels: counts do not add up: need exact <= matched <= compared <= answered <= sent" in note
    outputs = report.table.set_index("conc")["outputs"]
    assert cells.missing(outputs.loc[64]) and cells.missing(outputs.loc[256]) and outputs.loc[128].startswith("3/4")


def test_the_rate_counts_only_compared_sentinels_and_says_the_unit(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    # 64: 4 answered, the reference answered 3 of them, positions in characters (no token ids
    # came back). 256: 3 of 4 answered, none compared.
    edit_result(run, 64, sentinels=sentinel_section(64, [None, 9, None], not_compared=1, unit="character"))
    edit_result(run, 256, sentinels=sentinel_section(256, [], not_compared=3, unanswered=1))
    report = build_report([run], root=tmp_path)
    rows = {r["conc"]: r for _, r in report.table.iterrows()}
    assert rows[64]["outputs"] == "2/3 (first divergence at character 9; 1 not compared)"
    assert rows[64]["outputs_match_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert rows[256]["outputs"] == "0/3 compared (1 of 4 unanswered)"
    assert math.isnan(rows[256]["outputs_match_rate"])
    assert rows[128]["outputs"] == "3/4 (first divergence at token 17)"
    (drift,) = report.drifts
    assert [(s.conc, s.matched, s.compared, s.answered, s.sent) for s in drift.steps] == [
        (256, 0, 0, 3, 4),
        (64, 2, 3, 4, 4),
        (128, 3, 4, 4, 4),
    ]
    assert drift.fall is None  # 67 % then 75 %: a rise; 256 has no rate
    md = output_md.render(report)
    assert "- `run`: conc 256: 0/3 compared → conc 64: 2/3 → conc 128: 3/4\n" in md
    assert "matched/compared" in md
    (doc,) = json.loads(output_json.render(report))["outputs_drift"]
    assert [s["compared"] for s in doc["steps"]] == [0, 3, 4]


def test_older_results_have_no_outputs_column_or_sections(tmp_path: Path) -> None:
    report = build_report([DSR1_A], root=tmp_path)
    assert len(report.table) == 3 and all(p.sentinels is None for r in report.runs for p in r.points)
    assert "outputs" not in report.table.columns and report.drifts == [] and report.accuracy == []
    assert "Outputs" not in output_md.render(report) and "Accuracy" not in output_html.render(report)
    doc = json.loads(output_json.render(report))
    assert "outputs_drift" not in doc and "accuracy" not in doc and "outputs" not in output_csv.render(report)


# --- drift over the run ------------------------------------------------------------------------


def test_match_rate_in_sweep_order_flags_the_fall(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    report = build_report([run], root=tmp_path)
    (drift,) = report.drifts
    # Precondition: the sweep's order is not the concurrencies' order.
    assert [s.conc for s in drift.steps] == [256, 64, 128] != sorted(s.conc for s in drift.steps)
    assert drift.fall is not None and (drift.fall[0].conc, drift.fall[1].conc) == (256, 128)
    md = output_md.render(report)
    assert (
        "- `run`: conc 256: 4/4 → conc 64: 4/4 → conc 128: 3/4 — ⚠️ **falling: 100% at conc 256 to 75% at conc 128**"
    ) in md
    assert "falling: 100% at conc 256 to 75% at conc 128</span>" in output_html.render(report)
    (doc,) = json.loads(output_json.render(report))["outputs_drift"]
    assert [s["match_rate"] for s in doc["steps"]] == [1.0, 1.0, 0.75] and doc["fall"][1]["conc"] == 128


def test_date_orders_the_sweep_without_start_times_and_a_steady_rate_is_not_flagged(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    for conc, date, divergence in ((64, "20261201-100300", [None] * 4), (128, "20261201-100100", [None] * 4)):
        edit_result(run, conc, benchmark_start_time_unix=None, date=date, sentinels=sentinel_section(conc, divergence))
    edit_result(run, 256, benchmark_start_time_unix=None, date="20261201-100200")
    (drift,) = build_report([run], root=tmp_path).drifts
    assert [s.conc for s in drift.steps] == [128, 256, 64] and drift.fall is None
    md = output_md.render(build_report([run], root=tmp_path))
    line = next(line for line in md.splitlines() if line.startswith("- `run`: conc 128"))
    assert "falling" not in line


def test_a_rise_after_a_fall_still_shows_the_largest_fall(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    edit_result(run, 64, sentinels=sentinel_section(64, [5, 5, None, None]))  # 50 %, between 100 % and 75 %
    (drift,) = build_report([run], root=tmp_path).drifts
    assert [s.match_rate for s in drift.steps] == [1.0, 0.5, 0.75]
    assert drift.fall is not None and (drift.fall[0].conc, drift.fall[1].conc) == (256, 64)


# --- accuracy -----------------------------------------------------------------------------------


def test_confidence_interval_of_the_difference() -> None:
    c = compare(0.80, 0.011, 0.78, 0.0115)
    half = 1.96 * math.sqrt(0.011**2 + 0.0115**2)
    assert c.diff == pytest.approx(0.02) and (c.low, c.high) == pytest.approx((0.02 - half, 0.02 + half))
    assert compare(0.8, None, 0.78, 0.01).low is None


def test_accuracy_beside_threshold_baseline_and_before(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    write_eval_summary(run, "disagg", "before", 0.81, 0.0108)
    write_eval_summary(run, "disagg", "after", 0.74, 0.0121)
    write_eval_summary(run, "aggregated", "after", 0.80, 0.0110)
    report = build_report([run], root=tmp_path)
    assert [(r.phase, r.when) for r in report.accuracy] == [
        ("disagg", "before"),
        ("disagg", "after"),
        ("aggregated", "after"),
    ]
    after = report.accuracy[1]
    assert after.versus_aggregated is not None and after.versus_before is not None
    assert after.versus_aggregated.diff == pytest.approx(-0.06)
    half = 1.96 * math.sqrt(0.0121**2 + 0.0110**2)
    high = after.versus_aggregated.high
    assert high is not None and high == pytest.approx(-0.06 + half) and high < 0
    assert after.versus_before.diff == pytest.approx(-0.07)
    assert report.accuracy[0].versus_before is None and report.accuracy[2].versus_aggregated is None

    md = output_md.render(report)
    assert "## Accuracy" in md and "diff ± 1.96·sqrt(stderr₁² + stderr₂²)" in md
    line = next(line for line in md.splitlines() if "| disagg after the sweep, conc 256 |" in line)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2:6] == ["gsm8k (exact_match,strict-match)", "0.7400 ± 0.0121", "0.7000", "yes"]
    lo, hi = -0.06 - half, -0.06 + half
    assert cells[6] == f"0.8000; -0.0600 [{lo:+.4f}, {hi:+.4f}] significantly lower"
    assert cells[7].startswith("-0.0700 [") and cells[8] == "1319"
    html = output_html.render(report)
    assert '<h2 id="accuracy">Accuracy</h2>' in html and "significantly lower" in html
    doc = json.loads(output_json.render(report))["accuracy"]
    assert doc[1]["versus_aggregated"]["diff"] == pytest.approx(-0.06) and doc[1]["threshold"] == 0.7


def test_a_failed_or_unfinished_eval_is_said_and_a_bad_summary_skipped(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    write_eval_summary(run, "disagg", "after", 0.41, 0.013)
    write_eval_summary(run, "disagg", "before", None, None, error="lm-eval exited 1 after 600 s", passed=None)
    write_eval_summary(run, "aggregated", "after", 0.8, 0.01, tasks=[{"task": "gsm8k", "metric": "m", "score": "high"}])
    report = build_report([run], root=tmp_path)
    assert any(
        n == "run: accuracy BELOW THRESHOLD (disagg after the sweep): gsm8k exact_match,strict-match 0.41 < 0.7"
        for n in report.notes
    )
    assert any("accuracy eval (disagg before the sweep) did not finish: lm-eval exited 1" in n for n in report.notes)
    (bad,) = report.skipped
    assert bad.path == RunDir(run).accuracy_summary("aggregated", "after")
    assert bad.reason.startswith(
        "accuracy summary not used: tasks[0].score: Input should be a valid number, unable to parse string as a "
        "number ('high'); tasks[0].stderr: missing"
    ), bad.reason
    md = output_md.render(report)
    assert "| ⚠️ **NO** |" in md and "evals/aggregated-after/pdbench-accuracy.json" in md


def test_cli_report_shows_the_checks(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    write_eval_summary(run, "disagg", "after", 0.8, 0.01)
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 0, r.output
    assert "| 3/4 (first divergence at token 17) |" in r.stdout
    assert "## Outputs over the run" in r.stdout and "## Accuracy" in r.stdout


# --- collect --------------------------------------------------------------------------------------


def test_collect_leaves_out_points_that_failed_outputs_match(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    # Precondition: 128 is otherwise a valid point; only its outputs failed.
    assert json.loads((DSR1_A / NAME.format(128)).read_text())["metadata"]["valid"] is True
    result = collect([run], hw="x")
    assert [e["conc"] for e in result.entries] == [64]  # 256 fails kv_transferred in the fixture
    skipped = {s.path.name: s.reason for s in result.skipped}
    assert sorted(skipped) == [NAME.format(128), NAME.format(256)]
    assert skipped[NAME.format(128)].startswith("invalid point (metadata.valid is false: outputs_match: ")
    assert "--include-invalid keeps it" in skipped[NAME.format(128)]

    out = tmp_path / "agg.json"
    r = CliRunner().invoke(app, ["collect", str(run), "--hw", "x", "--include-invalid", "--out", str(out)])
    assert r.exit_code == 0, r.output
    kept = {e["conc"]: e for e in json.loads(out.read_text())}
    assert sorted(kept) == [64, 128, 256]
    assert kept[128]["valid"] is False and kept[128]["validity"] == "invalid"
