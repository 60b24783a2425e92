"""The search's report says where the limit moves: per candidate the run report's own line per
sweep, read from the run directory's bottleneck sections, and per SLO the verdict each candidate
met at its best point. Synthetic run directories as a job writes them (test_search_outcome's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.search_runs import AGG, LADDER, LAUNCHED, ONE_P_ONE_D, SLOS, TWO_P_ONE_D, result, write_run

from harness.report.bottleneck import limit_lines
from harness.report.load import load_runs
from harness.rundir.bottleneck_summary import BottleneckSummary, Evidence, Verdict
from harness.search.outcome import ReportEntry, read_outcome
from harness.search.report import read_limits, write_report


def judged(data: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
    """The result with the bottleneck section the client writes (only the verdict matters here)."""
    summary = BottleneckSummary(verdict=verdict, dominant=None, saturated=[], reasons=[], evidence=Evidence())
    return data | {"bottleneck": summary.model_dump(mode="json")}


def one_p_one_d(search: Path) -> Path:
    """1, 2 not saturated, prefill-bound from 4; tight's best is 4 (6 and 8 break its TPOT bound),
    loose's 8. A repeat of 4 says decode-bound: the first measurement is the best point's."""
    t = LAUNCHED + 30.0
    pts = [
        judged(result(1, total=400.0, started=t), "not saturated"),
        judged(result(2, total=700.0, started=t + 10), "not saturated"),
        judged(result(4, total=1100.0, started=t + 20, tpot_p90=30.0), "prefill-bound"),
        judged(result(8, total=1500.0, started=t + 30, tpot_p90=55.0, ttft_p90=900.0), "prefill-bound"),
        judged(result(6, total=1300.0, started=t + 40, tpot_p90=45.0), "prefill-bound"),
    ]
    reps = {1: [judged(result(4, total=1080.0, started=t + 50, repeat=1), "decode-bound")]}
    record = {"ladder": LADDER, "slos": SLOS, "best": {"tight": 4, "loose": 8}, "done": True}
    return write_run(search / "runs" / "1p1d" / "run", pts, repeats=reps, slo_search=record)


def aggregated(search: Path) -> Path:
    """The baseline: decode-bound from 2, its best for both SLOs."""
    t = LAUNCHED + 20
    pts = [
        judged(result(1, total=500.0, started=t, disagg=False, prefill_gpus=2), "not saturated"),
        judged(result(2, total=700.0, started=t + 10, disagg=False, prefill_gpus=2), "decode-bound"),
    ]
    return write_run(search / "runs" / "agg-2" / "run", pts)


def entries(search: Path) -> list[ReportEntry]:
    one, agg = one_p_one_d(search), aggregated(search)
    return [
        ReportEntry(ONE_P_ONE_D, "done", "ran", one, read_outcome(one, ONE_P_ONE_D, SLOS)),
        ReportEntry(TWO_P_ONE_D, "skipped", "skipped: prefill-bound 1p1d bounds it", None, None),
        ReportEntry(AGG, "done", "ran: the aggregated baseline", agg, read_outcome(agg, AGG, SLOS)),
    ]


ONE_LINE = "1p1d (disagg, ISL 256, OSL 32): not saturated at C=1–2; prefill-bound from C=4"
AGG_LINE = "agg-2 (agg, ISL 256, OSL 32): not saturated at C=1; decode-bound from C=2"


def test_the_lines_are_the_run_reports_own(tmp_path: Path) -> None:
    es = entries(tmp_path / "search")
    limits = read_limits(es[0])
    assert limits is not None and limits.lines == (ONE_LINE,)
    # pdbench report on the same directory gives the same line, labelled by the directory's name
    (run,) = load_runs([es[0].run]).runs  # type: ignore[list-item]
    assert limit_lines([run]) == [ONE_LINE.replace("1p1d (", f"{run.label} (", 1)]
    assert limits.at_best == {"tight": (4, "prefill-bound"), "loose": (8, "prefill-bound")}
    assert read_limits(es[1]) is None  # skipped: no run directory


def test_report_md_says_where_the_limit_moves(tmp_path: Path) -> None:
    search = tmp_path / "search"
    md = write_report(search, LADDER, SLOS, entries(search))[0].read_text()
    section = md[md.index("## Where the limit moves") : md.index("## Cost")]
    assert section.splitlines()[4:] == [
        f"- {ONE_LINE}",
        f"- {AGG_LINE}",
        "- **tight**, at each candidate's best point: 1p1d prefill-bound at c=4; agg-2 decode-bound at c=2",
        "- **loose**, at each candidate's best point: 1p1d prefill-bound at c=8; agg-2 decode-bound at c=2",
        "",
    ]


def test_report_json_has_the_limits(tmp_path: Path) -> None:
    search = tmp_path / "search"
    data = json.loads(write_report(search, LADDER, SLOS, entries(search))[1].read_text())
    one, skipped, agg = data["candidates"]
    assert one["limits"] == {
        "lines": [ONE_LINE],
        "at_best": {
            "tight": {"concurrency": 4, "verdict": "prefill-bound"},
            "loose": {"concurrency": 8, "verdict": "prefill-bound"},
        },
    }
    assert skipped["limits"] is None
    assert agg["limits"]["lines"] == [AGG_LINE]


def test_results_without_verdicts_leave_the_section_out(tmp_path: Path) -> None:
    """Results written before the verdict existed: no lines, the best point's verdict unknown."""
    search = tmp_path / "search"
    run = write_run(search / "runs" / "1p1d" / "run", [result(1, total=400.0, started=LAUNCHED + 30)])
    entry = ReportEntry(ONE_P_ONE_D, "done", "ran", run, read_outcome(run, ONE_P_ONE_D, SLOS))
    limits = read_limits(entry)
    assert limits is not None and limits.lines == ()
    assert limits.best_text("tight", "1p1d") == "1p1d no verdict recorded at c=1"
    md = write_report(search, LADDER, SLOS, [entry])[0].read_text()
    assert "## Where the limit moves" not in md
