"""A candidate's outcome read back from a run directory: best concurrency per SLO judged again,
goodput-per-device samples and interval, limit side, cost and plot points; and `pdbench report`
leaving an SLO search's repeats out of a run's points."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.search_runs import LAUNCHED, ONE_P_ONE_D, SLOS, STARTED, TIGHT, ladder_run, name, result, write_run

from harness.report.load import load_runs
from harness.search.outcome import CandidateOutcome, read_outcome
from harness.search.space import Candidate


def test_the_best_point_its_samples_and_the_decode_limit(tmp_path: Path) -> None:
    out = read_outcome(ladder_run(tmp_path), ONE_P_ONE_D, SLOS)
    assert out.state == "succeeded" and out.done
    tight = out.slos["tight"]
    assert tight.best == 4 and tight.recorded_best == 4
    # goodput per device = total_token_throughput / (prefill_gpus + decode_gpus), first then repeats
    assert tight.samples == (550.0, 540.0, 560.0)
    assert tight.interval is not None and tight.interval.n == 3
    assert tight.interval.mean == pytest.approx(550.0)
    # sd 10, t(0.975, 2) = 4.302653: 10 * 4.302653 / sqrt(3)
    assert tight.interval.half_width == pytest.approx(24.8414, abs=1e-3)
    # the lowest failing concurrency above the best is 6 (measured after 8): TPOT only, decode
    assert tight.limit.side == "decode" and tight.limit.concurrency == 6
    assert tight.limit.metrics == ("tpot",)
    assert tight.limit.evidence == ("tpot_p90 45.0 ms > 40 ms",)
    assert out.throughput("tight") == pytest.approx(1100.0)
    loose = out.slos["loose"]
    assert loose.best == 8 and loose.samples == (750.0,)
    assert loose.interval is not None and math.isinf(loose.interval.half_width)
    assert loose.limit.side == "unknown" and loose.limit.concurrency is None
    assert "no limit seen" in loose.limit.evidence[0]
    assert out.notes == ()


def test_cost_from_the_nodes_start_to_the_end(tmp_path: Path) -> None:
    out = read_outcome(ladder_run(tmp_path), ONE_P_ONE_D, SLOS)
    # launched at 0, nodes started at +3 s; the last point (repeat 2) ends at +92 s, the status at +93 s
    assert out.cost.points == 7
    assert out.cost.wall_s == pytest.approx(90.0)
    assert out.cost.device_hours == pytest.approx(2 * 90.0 / 3600)
    assert out.cost.startup_s == pytest.approx(27.0)
    assert out.cost.per_point_s == pytest.approx(63.0 / 7)


def test_without_rendezvous_records_the_launch_starts_the_clock(tmp_path: Path) -> None:
    run = ladder_run(tmp_path)
    shutil.rmtree(run / "nodes")
    out = read_outcome(run, ONE_P_ONE_D, SLOS)
    assert out.cost.wall_s == pytest.approx(93.0) and out.cost.startup_s == pytest.approx(30.0)


def test_every_point_for_the_plot(tmp_path: Path) -> None:
    out = read_outcome(ladder_run(tmp_path), ONE_P_ONE_D, SLOS)
    assert [(p.concurrency, p.repeat) for p in out.points] == [(1, 0), (2, 0), (4, 0), (6, 0), (8, 0), (4, 1), (4, 2)]
    p8 = next(p for p in out.points if p.concurrency == 8)
    assert p8.goodput_per_device == 750.0 and p8.interactivity == pytest.approx(125.0)
    assert p8.ttft_p90_ms == 900.0 and p8.meets == {"tight": False, "loose": True}
    assert out.points[-1].file == "repeats/2/" + name(4)


def test_the_json_round_trip(tmp_path: Path) -> None:
    out = read_outcome(ladder_run(tmp_path), ONE_P_ONE_D, SLOS)
    again = CandidateOutcome.from_json(json.loads(json.dumps(out.to_json(), allow_nan=False)))
    assert again == out


@pytest.mark.parametrize(
    ("breaks", "side", "metrics"),
    [
        ({"ttft_p90": 900.0}, "prefill", ("ttft",)),
        ({"ttft_p90": 900.0, "tpot_p90": 50.0}, "unknown", ("tpot", "ttft")),
        ({"failed": 2}, "unknown", ()),
        ({"verdict": "invalid"}, "unknown", ()),
        ({"stop_reason": "the time limit is near"}, "unknown", ()),
    ],
)
def test_the_limit_side_and_its_evidence(tmp_path: Path, breaks: dict[str, Any], side: str, metrics: tuple) -> None:
    t = LAUNCHED + 10
    run = write_run(
        tmp_path / "run", [result(1, total=400.0, started=t), result(2, total=600.0, started=t + 5, **breaks)]
    )
    limit = read_outcome(run, ONE_P_ONE_D, {"tight": TIGHT}).slos["tight"].limit
    assert (limit.side, limit.concurrency, limit.metrics) == (side, 2, metrics)
    if "failed" in breaks:
        assert limit.evidence == ("2 failed requests",)
    if "verdict" in breaks:
        assert limit.evidence == ("invalid: kv",)
    if "stop_reason" in breaks:
        assert limit.evidence == ("cut short: the time limit is near",)


def test_a_point_meeting_above_a_failure_is_not_the_best(tmp_path: Path) -> None:
    """The ladder search stops at the first failure; a point measured higher for another SLO that
    meets by chance does not make the best, and the job's own different answer is noted."""
    t = LAUNCHED + 10
    pts = [
        result(1, total=400.0, started=t),
        result(2, total=600.0, started=t + 5, tpot_p90=41.0),
        result(4, total=900.0, started=t + 10, tpot_p90=39.0),
    ]
    run = write_run(tmp_path / "run", pts, slo_search={"slos": {"tight": TIGHT}, "best": {"tight": 4}, "done": True})
    out = read_outcome(run, ONE_P_ONE_D, {"tight": TIGHT})
    assert out.slos["tight"].best == 1 and out.slos["tight"].recorded_best == 4
    assert out.notes == ("tight: the job's slo_search.json says best c=4, judged again here: c=1",)


def test_no_point_meets(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [result(1, total=400.0, started=LAUNCHED + 10, tpot_p90=60.0)])
    tight = read_outcome(run, ONE_P_ONE_D, {"tight": TIGHT}).slos["tight"]
    assert tight.best is None and tight.samples == () and tight.interval is None
    assert (tight.limit.side, tight.limit.concurrency) == ("decode", 1)


def test_an_aggregated_candidate_counts_its_own_devices(tmp_path: Path) -> None:
    agg = Candidate("agg-2", "agg", (), 2, 0, 1, {"aggregated": 2.0})
    run = write_run(tmp_path / "run", [result(1, total=500.0, started=LAUNCHED + 5, disagg=False, prefill_gpus=2)])
    out = read_outcome(run, agg, {"tight": TIGHT})
    assert out.slos["tight"].samples == (250.0,) and out.devices == 2


def test_a_job_killed_before_its_status(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [result(1, total=400.0, started=LAUNCHED + 10)], finished_at=None)
    out = read_outcome(run, ONE_P_ONE_D, {"tight": TIGHT})
    assert out.state is None
    newest = max(p.stat().st_mtime for p in run.rglob("*") if p.is_file())
    assert out.cost.wall_s == pytest.approx(newest - STARTED)
    assert out.notes == ("no finished_at in status.json: the job's end is taken as its newest file's time",)


def test_a_run_never_launched_has_no_cost(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [], finished_at=None)
    (run / "launch.json").unlink()
    shutil.rmtree(run / "nodes")
    out = read_outcome(run, ONE_P_ONE_D, {"tight": TIGHT})
    assert out.cost.wall_s is None and out.cost.device_hours is None and out.cost.points == 0
    assert out.slos["tight"].limit.evidence == ("no point measured",)


def test_report_leaves_the_repeats_out(tmp_path: Path) -> None:
    run = ladder_run(tmp_path)
    assert len(list(run.glob("repeats/*/concurrency_*.json"))) == 2
    loaded = load_runs([run])
    assert sorted(p.concurrency for p in loaded.runs[0].points) == [1, 2, 4, 6, 8]
    assert loaded.skipped == []


def test_a_job_that_searched_for_other_slos(tmp_path: Path) -> None:
    record = {"slos": {"tight": {"ttft_p90": 500.0}}, "best": {"tight": 1}, "done": True}
    run = write_run(tmp_path / "run", [result(1, total=400.0, started=LAUNCHED + 10)], slo_search=record)
    out = read_outcome(run, ONE_P_ONE_D, {"tight": TIGHT})
    assert out.slos["tight"].best == 1 and out.slos["tight"].recorded_best is None
    assert len(out.notes) == 1 and out.notes[0].startswith("the job searched for other SLOs")


def test_a_failing_start_bisected_down(tmp_path: Path) -> None:
    """The job started at 4, which failed, and went down: 1 and 2 meet, so the best is 2."""
    t = LAUNCHED + 10
    pts = [
        result(4, total=900.0, started=t, tpot_p90=41.0),
        result(1, total=400.0, started=t + 5),
        result(2, total=600.0, started=t + 10),
    ]
    tight = read_outcome(write_run(tmp_path / "run", pts), ONE_P_ONE_D, {"tight": TIGHT}).slos["tight"]
    assert tight.best == 2 and tight.samples == (300.0,)
    assert (tight.limit.side, tight.limit.concurrency) == ("decode", 4)


def test_a_point_without_devices_counts_the_candidates(tmp_path: Path) -> None:
    data = result(1, total=400.0, started=LAUNCHED + 10)
    del data["metadata"]["prefill_gpus"], data["metadata"]["decode_gpus"]
    run = write_run(tmp_path / "run", [], finished_at=LAUNCHED + 20)
    (run / "concurrency_1_req_rate_inf.json").write_text(json.dumps(data))
    out = read_outcome(run, ONE_P_ONE_D, {"tight": TIGHT})
    assert out.slos["tight"].samples == (200.0,)
    assert out.notes == ("concurrency_1_req_rate_inf.json: records no devices; the candidate's 2 used",)
