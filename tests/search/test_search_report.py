"""A search's report from real (synthetic) run directories: report.md lists every candidate with its
reason and per-SLO figures, the winner, the baseline and the cost; report.json says the same for
programs; pareto.png is a picture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.search_runs import AGG, LADDER, LAUNCHED, ONE_P_ONE_D, SLOS, TWO_P_ONE_D, ladder_run, result, write_run
from matplotlib.image import imread

from harness.search.outcome import EXCLUDED, ReportEntry, read_outcome
from harness.search.report import write_report
from harness.search.space import Candidate

TWO_P_TWO_D = Candidate("2p2d", "disagg", (), 2, 2, 4, {"prefill": 2.0, "decode": 2.0})


def entries(search: Path) -> list[ReportEntry]:
    """1P1D ran its ladder (best 4 for tight, 8 for loose), the aggregated baseline two points,
    2P1D was pruned and 2P2D excluded."""
    one = ladder_run(search / "runs" / "1p1d")
    t = LAUNCHED + 20
    agg_points = [
        result(1, total=500.0, started=t, disagg=False, prefill_gpus=2),
        result(2, total=700.0, started=t + 10, disagg=False, prefill_gpus=2, tpot_p90=50.0),
    ]
    agg = write_run(search / "runs" / "agg-2" / "run", agg_points)
    return [
        ReportEntry(
            ONE_P_ONE_D,
            "done",
            "ran: nothing measured bounds it yet (tight)",
            one,
            read_outcome(one, ONE_P_ONE_D, SLOS),
        ),
        ReportEntry(TWO_P_ONE_D, "skipped", "skipped: decode-bound 1p1d bounds it | at <= 403.3", None, None),
        ReportEntry(TWO_P_TWO_D, EXCLUDED, "4 devices > max_devices 3", None, None),
        ReportEntry(AGG, "done", "ran: the aggregated baseline is never pruned", agg, read_outcome(agg, AGG, SLOS)),
    ]


@pytest.fixture
def written(tmp_path: Path) -> list[Path]:
    search = tmp_path / "search"
    return write_report(search, LADDER, SLOS, entries(search))


def test_the_three_files(written: list[Path]) -> None:
    assert [p.name for p in written] == ["report.md", "report.json", "pareto.png"]
    assert all(p.is_file() for p in written)
    assert not [p for p in written[0].parent.iterdir() if p.name.endswith(".tmp")]


def test_report_md(written: list[Path]) -> None:
    md = written[0].read_text()
    assert md.startswith("# Search search\n")  # no title given: the directory's name
    assert (
        "Ladder: 1, 2, 4, 6, 8. SLOs: **tight** ttft_p90 <= 800 ms, tpot_p90 <= 40 ms; **loose** ttft_p90 <= 3000 ms."
        in md
    )
    # 1P1D: best 4 for tight at 550 ± 24.8 from 3 samples, limited on decode at 6
    assert (
        "| 1p1d | 1/1 | done | measured | ran: nothing measured bounds it yet (tight) | 4 | 550.0 ± 24.8 (n=3) | "
        "decode at c=6: tpot_p90 45.0 ms > 40 ms | 8 | 750.0 ± ? (n=1) | unknown (c=8, the highest measured, "
        "meets: no limit seen) |"
    ) in md
    assert "| 2p1d | 2/1 | skipped | skipped | skipped: decode-bound 1p1d bounds it \\| at <= 403.3 |" in md
    assert "| 2p2d | 2/2 | excluded | excluded | 4 devices > max_devices 3 |" in md
    assert (
        "| agg-2 | agg 2 | done | measured | ran: the aggregated baseline is never pruned | 1 | 250.0 ± ? (n=1) |" in md
    )
    assert (
        "- tight: winner 1p1d at c=4, 550.0 ± 24.8 tok/s/device; "
        "aggregated baseline agg-2 at c=1, 250.0 ± ? tok/s/device: ratio 2.20x"
    ) in md
    assert "- loose: winner 1p1d at c=8, 750.0 ± ? tok/s/device; aggregated baseline agg-2 at c=2" in md
    # the grid: 1P1D, 2P1D and the baseline (2P2D excluded) over 5 points each
    assert "device-hours over 2 jobs; the full grid by hand (3 jobs × 5 points, no repeats)" in md


def test_report_json(written: list[Path]) -> None:
    data = json.loads(written[1].read_text())
    assert data["ladder"] == LADDER and data["slos"] == SLOS
    assert [c["name"] for c in data["candidates"]] == ["1p1d", "2p1d", "2p2d", "agg-2"]
    one = data["candidates"][0]
    assert one["run"] == "runs/1p1d/run" and one["status"] == "done"
    assert one["outcome"]["slos"]["tight"]["samples"] == [550.0, 540.0, 560.0]
    assert data["candidates"][1]["outcome"] is None
    tight = data["winners"]["tight"]
    assert tight["winner"]["candidate"] == "1p1d" and tight["tie"] is False
    assert tight["baseline"]["candidate"] == "agg-2" and tight["ratio"] == pytest.approx(2.2)
    assert data["spend"]["jobs"] == 2 and data["spend"]["grid_jobs"] == 3


def test_pareto_png(written: list[Path]) -> None:
    image = imread(written[2])
    assert image.shape[:2] == (600, 900)
    assert image.std() > 0  # something is drawn


def test_a_search_with_nothing_run_yet(tmp_path: Path) -> None:
    paths = write_report(tmp_path, LADDER, SLOS, [ReportEntry(ONE_P_ONE_D, "planned", "", None, None)], title="pd")
    md = paths[0].read_text()
    assert md.startswith("# Search pd\n")
    assert json.loads(paths[1].read_text())["search"] == "pd"
    assert "- tight: no winner: no disaggregated candidate meets it at any measured concurrency" in md
    assert "0.000 device-hours over 0 jobs; the full grid's estimate needs a measured job." in md
    assert json.loads(paths[1].read_text())["winners"]["tight"]["winner"] is None
