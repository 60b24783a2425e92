"""A candidate's outcome read back from a run directory: best concurrency per SLO judged again,
goodput-per-device samples and interval, limit side, cost and plot points; and `pdbench report`
leaving an SLO search's repeats out of a run's points."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.report.load import load_runs
from harness.search.outcome import CandidateOutcome, read_outcome
from harness.search.space import Candidate

LAUNCHED = 1_795_669_000.0
STARTED = LAUNCHED + 3.0  # the job waited 3 s in the queue, then its nodes started
TIGHT = {"ttft_p90": 800.0, "tpot_p90": 40.0}
LOOSE = {"ttft_p90": 3000.0}
SLOS = {"tight": TIGHT, "loose": LOOSE}
ONE_P_ONE_D = Candidate("1p1d", "disagg", (), 1, 1, 2, {"prefill": 1.0, "decode": 1.0})


def result(
    conc: int,
    *,
    total: float,
    ttft_p90: float = 100.0,
    tpot_p90: float = 10.0,
    median_tpot: float = 8.0,
    started: float,
    repeat: int = 0,
    failed: int = 0,
    stop_reason: str | None = None,
    verdict: str = "valid",
    disagg: bool = True,
    prefill_gpus: int = 1,
    decode_gpus: int = 1,
) -> dict[str, Any]:
    """A result file as `pdbench bench` writes one (the keys by their real names, fewer of them)."""
    metadata: dict[str, Any] = {
        "pdbench_version": "0.1.0",
        "disagg": disagg,
        "recipe": "tiny-fp32-cpu-nixl-1p1d",
        "recipe_fingerprint": "65afccaa4a0cde83",
        "valid": verdict == "valid",
        "validity": {"verdict": verdict, "valid": verdict == "valid", "reasons": [] if verdict == "valid" else ["kv"]},
        "slo_search": {"repeat": repeat, "slos": {}},
    }
    if disagg:
        metadata |= {"prefill_gpus": prefill_gpus, "decode_gpus": decode_gpus}
    else:
        metadata["gpus"] = prefill_gpus
    return {
        "date": "20261126-050324",
        "backend": "openai",
        "model_id": "tiny",
        "num_prompts": 8,
        "request_rate": "inf",
        "max_concurrency": conc,
        "random_input_len": 256,
        "random_output_len": 32,
        "stop_reason": stop_reason,
        "duration": 2.0,
        "benchmark_start_time_unix": started,
        "benchmark_end_time_unix": started + 2.0,
        "completed": 8 - failed,
        "failed": failed,
        "total_input_tokens": 2048,
        "total_output_tokens": 256,
        "request_throughput": 4.0,
        "output_throughput": total / 9,
        "total_token_throughput": total,
        "mean_ttft_ms": ttft_p90 * 0.8,
        "median_ttft_ms": ttft_p90 * 0.8,
        "p90_ttft_ms": ttft_p90,
        "p99_ttft_ms": ttft_p90 * 1.1,
        "mean_tpot_ms": median_tpot,
        "median_tpot_ms": median_tpot,
        "p90_tpot_ms": tpot_p90,
        "p99_tpot_ms": tpot_p90 * 1.1,
        "median_itl_ms": median_tpot,
        "p90_itl_ms": tpot_p90,
        "median_e2el_ms": 400.0,
        "p90_e2el_ms": 450.0,
        "metadata": metadata,
    }


def name(conc: int, disagg: bool = True) -> str:
    return f"concurrency_{conc}_req_rate_inf_gpus_2" + ("_ctx_1_gen_1" if disagg else "") + ".json"


def write_run(
    path: Path,
    points: list[dict[str, Any]],
    *,
    repeats: dict[int, list[dict[str, Any]]] | None = None,
    finished_at: float | None = 0.0,
    slo_search: dict[str, Any] | None = None,
) -> Path:
    """A run directory as a finished job leaves it: plan, launch record, the nodes' rendezvous
    records, results, repeats/<k>/, slo_search.json and status.json (finished_at 0.0: one second
    after the last point)."""
    path.mkdir(parents=True)
    (path / "plan.json").write_text(json.dumps({"processes": [], "num_nodes": 2, "proxy_node": 0}))
    launch = {"launcher": "slurm", "job_id": "7", "host": "vm", "time": LAUNCHED, "pid": None, "create_time": None}
    (path / "launch.json").write_text(json.dumps(launch))
    (path / "nodes").mkdir()
    for node, at in ((0, STARTED + 1.0), (1, STARTED)):  # each node's rendezvous record, as it starts
        (path / "nodes" / f"{node}.json").write_text(json.dumps({"node": node, "addr": "10.77.0.11"}))
        os.utime(path / "nodes" / f"{node}.json", (at, at))
    for data in points:
        (path / name(data["max_concurrency"], data["metadata"]["disagg"])).write_text(json.dumps(data))
    for k, pts in (repeats or {}).items():
        (path / "repeats" / str(k)).mkdir(parents=True)
        for data in pts:
            (path / "repeats" / str(k) / name(data["max_concurrency"])).write_text(json.dumps(data))
    if slo_search is not None:
        (path / "slo_search.json").write_text(json.dumps(slo_search))
    if finished_at is not None:
        every = points + [p for pts in (repeats or {}).values() for p in pts]
        end = finished_at or max(p["benchmark_end_time_unix"] for p in every) + 1.0
        status = {"state": "succeeded", "exit_code": 0, "reason": None, "failure": None, "finished_at": end}
        (path / "status.json").write_text(json.dumps(status))
    return path


def ladder_run(tmp_path: Path) -> Path:
    """1, 2, 4 meet the tight SLO; 8 then 6 break its TPOT bound; 4 is measured twice more."""
    t = LAUNCHED + 30.0  # 30 s of start-up
    pts = [
        result(1, total=400.0, started=t),
        result(2, total=700.0, started=t + 10),
        result(4, total=1100.0, started=t + 20, tpot_p90=30.0),
        result(8, total=1500.0, started=t + 30, tpot_p90=55.0, ttft_p90=900.0),
        result(6, total=1300.0, started=t + 40, tpot_p90=45.0),
    ]
    reps = {
        1: [result(4, total=1080.0, started=t + 50, repeat=1)],
        2: [result(4, total=1120.0, started=t + 60, repeat=2)],
    }
    record = {"ladder": [1, 2, 4, 6, 8], "slos": SLOS, "best": {"tight": 4, "loose": 8}, "done": True}
    return write_run(tmp_path / "run", pts, repeats=reps, slo_search=record)


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
