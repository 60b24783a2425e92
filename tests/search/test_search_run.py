"""The search directory and the search's run: order, budget, pruning, resume, stops.

Jobs here are a fake launcher's, which writes each candidate's run directory as a finished job
leaves it (a fake isolates the orchestration; tests/e2e/test_search_e2e.py runs real jobs).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.search_launcher import MEASURES, FakeLauncher, start, statuses

from harness import atomic
from harness.launch.job import JobState
from harness.rundir import RunDir
from harness.search.search_dir import CandidateState, SearchDir, SearchDirError, differences
from harness.search.space import Candidate
from harness.submit.refused import Refused

C1 = Candidate("1p1d", "disagg", ("topology.decode.workers=1",), 1, 1, 2, {"prefill": 1.0, "decode": 1.0})


def test_the_state_round_trips_through_state_json(tmp_path: Path) -> None:
    sdir = SearchDir(tmp_path / "s")
    assert sdir.begin({"spec": {"a": 1}}) is False
    state = CandidateState(
        C1, "failed", "boom", "runs/1p1d/r/1", "42", 1.0, 2.0, 3.0, {"x": 1}, ("runs/old",), ({"y": 2},)
    )
    sdir.put(state)
    again = SearchDir(tmp_path / "s")
    assert again.begin({"spec": {"a": 1}}) is True
    assert again.states == {"1p1d": state}
    data = json.loads((tmp_path / "s" / "state.json").read_text())
    entry = data["candidates"][0]
    assert entry["devices"] == 2 and entry["status"] == "failed" and entry["run"] == "runs/1p1d/r/1"


def test_another_search_in_the_directory_is_refused_naming_what_differs(tmp_path: Path) -> None:
    sdir = SearchDir(tmp_path / "s")
    sdir.begin({"launcher": "slurm", "spec": {"concurrency": [1, 2], "prune": {"slack": 1.1}}})
    recorded = yaml.safe_load((tmp_path / "s" / "search.yaml").read_text())
    assert recorded["definition"]["spec"]["concurrency"] == [1, 2] and len(recorded["hash"]) == 16
    with pytest.raises(SearchDirError, match=r"spec\.concurrency, spec\.prune\.slack differ"):
        SearchDir(tmp_path / "s").begin({"launcher": "slurm", "spec": {"concurrency": [1, 4], "prune": {"slack": 1.2}}})


def test_differences_names_added_and_removed_keys() -> None:
    assert differences({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}, "d": 3}) == ["a.c", "d"]
    assert differences({"a": [1]}, {"a": [1]}) == []


def test_paths_of_the_search_directory(tmp_path: Path) -> None:
    sdir = SearchDir(tmp_path)
    assert sdir.results_dir("1p2d") == tmp_path / "runs" / "1p2d"
    assert [p.name for p in (sdir.report_md, sdir.report_json, sdir.pareto)] == [
        "report.md",
        "report.json",
        "pareto.png",
    ]
    assert sdir.relative(tmp_path / "runs" / "1p2d" / "x") == "runs/1p2d/x"


# --- the search's run, with a fake launcher ---------------------------------------------------


def test_a_search_runs_fewest_devices_first_then_the_baseline_and_reports(tmp_path: Path) -> None:
    fake = FakeLauncher()
    s = start(tmp_path, fake)
    assert s.run() == 0
    assert fake.launched == ["1p1d", "1p2d", "2p1d", "agg3"]
    assert statuses(s) == {"1p1d": "done", "1p2d": "done", "2p1d": "done", "2p2d": "excluded", "agg3": "done"}
    state = SearchDir(s.sdir.path).read_state()
    # 1p2d meets the SLO up to c=4: 800 tok/s on 3 devices.
    assert state["1p2d"].outcome is not None and state["1p2d"].outcome["slos"]["tight"]["best"] == 4
    assert "best c=4" in state["1p2d"].reason
    assert state["1p2d"].run is not None and (s.sdir.path / state["1p2d"].run / "status.json").is_file()
    assert state["1p2d"].run.startswith("runs/1p2d/")
    assert state["2p2d"].reason == "4 devices > constraints.max_devices 3"
    assert s.sdir.report_md.is_file() and s.sdir.report_json.is_file()


def test_the_max_jobs_budget_skips_with_the_reason(tmp_path: Path) -> None:
    fake = FakeLauncher()
    s = start(tmp_path, fake, budget={"max_jobs": 2})
    assert s.run() == 0
    assert fake.launched == ["1p1d", "1p2d"]
    state = SearchDir(s.sdir.path).read_state()
    assert state["2p1d"].status == "skipped" and state["2p1d"].reason == "budget.max_jobs 2 reached (2 jobs launched)"
    assert state["agg3"].status == "skipped"


def test_the_device_hours_budget_skips_a_job_the_estimate_says_would_pass_it(tmp_path: Path) -> None:
    fake = FakeLauncher(wall_s=3600.0)  # every job: one hour
    s = start(tmp_path, fake, budget={"device_hours": 4.0, "nodes_in_flight": 3})
    assert s.run() == 0
    # 1p1d spent 2 device-hours; 1p2d's estimate (3 devices x 1 h) would pass 4; the baseline at
    # the winner's 2 devices just fits.
    assert fake.launched == ["1p1d", "agg2"]
    reason = SearchDir(s.sdir.path).read_state()["1p2d"].reason
    assert reason.startswith("budget.device_hours 4: spent 2.000") and "estimate 3.000" in reason


def test_jobs_fly_together_within_the_node_budget(tmp_path: Path) -> None:
    flying: list[int] = []
    fake = FakeLauncher(
        states={n: [JobState.PENDING, JobState.RUNNING, JobState.RUNNING, JobState.COMPLETED] for n in MEASURES}
    )

    def count(name: str, polls: int) -> None:
        flying.append(sum(j.polls < 4 for j in fake.jobs.values()))

    fake.on_info = count
    s = start(tmp_path, fake, budget={"nodes_in_flight": 5})
    assert s.run() == 0
    assert fake.launched == ["1p1d", "1p2d", "2p1d", "agg3"]
    assert max(flying) == 2  # 1p1d (2 nodes) with 1p2d (3 nodes); never 3 jobs (8 nodes)


def test_a_job_cancelled_outside_stops_the_search_and_a_resume_runs_it_again(tmp_path: Path) -> None:
    fake = FakeLauncher(states={"1p2d": [JobState.RUNNING, JobState.CANCELLED]})
    s = start(tmp_path, fake, budget={"nodes_in_flight": 3})
    assert s.run() == 1
    assert fake.launched == ["1p1d", "1p2d"]
    first = SearchDir(s.sdir.path).read_state()
    assert first["1p2d"].status == "cancelled" and "cancelled" in first["1p2d"].reason
    assert first["2p1d"].status == "planned"
    assert s.sdir.report_md.is_file()

    again = FakeLauncher()
    s2 = start(tmp_path, again, budget={"nodes_in_flight": 3})
    assert s2.run() == 0
    assert again.launched == ["1p2d", "2p1d", "agg3"]  # 1p1d kept
    state = SearchDir(s2.sdir.path).read_state()
    assert state["1p2d"].status == "done" and state["1p2d"].earlier_runs == (first["1p2d"].run,)
    assert state["1p2d"].run != first["1p2d"].run
    assert (s2.sdir.path / str(first["1p2d"].run)).is_dir()  # the old run kept


def test_a_cancelled_baseline_runs_again_and_its_first_run_still_counts(tmp_path: Path) -> None:
    fake = FakeLauncher(states={"agg3": [JobState.RUNNING, JobState.CANCELLED]})
    s = start(tmp_path, fake, budget={"nodes_in_flight": 3})
    assert s.run() == 1
    first = SearchDir(s.sdir.path).read_state()["agg3"]
    assert first.status == "cancelled" and first.run is not None and first.outcome is not None

    s2 = start(tmp_path, FakeLauncher(), budget={"nodes_in_flight": 3})
    assert s2.run() == 0
    state = SearchDir(s2.sdir.path).read_state()["agg3"]
    assert state.status == "done" and state.run != first.run
    assert state.earlier_runs == (first.run,) and len(state.earlier_outcomes) == 1
    # The cancelled job's devices were held: the report counts its cost as spent.
    entry = next(e for e in s2.entries() if e.candidate.name == "agg3")
    assert len(entry.earlier) == 1


def test_a_failed_job_is_recorded_with_its_reason_and_the_exit_says_so(tmp_path: Path) -> None:
    fake = FakeLauncher(states={"2p1d": [JobState.RUNNING, JobState.FAILED]})
    s = start(tmp_path, fake)
    assert s.run() == 1
    state = SearchDir(s.sdir.path).read_state()
    assert state["2p1d"].status == "failed" and state["2p1d"].reason == "a node failed"
    assert state["agg3"].status == "done"  # the others went on


def test_resuming_another_search_is_refused_naming_the_key(tmp_path: Path) -> None:
    s = start(tmp_path, FakeLauncher())
    assert s.run() == 0
    with pytest.raises(Refused, match=r"spec\.concurrency differ"):
        start(tmp_path, FakeLauncher(), concurrency=[1, 2, 8])


def test_a_resume_of_a_finished_search_launches_nothing(tmp_path: Path) -> None:
    assert start(tmp_path, FakeLauncher()).run() == 0
    fake = FakeLauncher()
    assert start(tmp_path, fake).run() == 0
    assert fake.launched == []


def test_sigint_cancels_the_jobs_in_flight(tmp_path: Path) -> None:
    def interrupt(name: str, polls: int) -> None:
        if polls == 2:
            os.kill(os.getpid(), signal.SIGINT)

    fake = FakeLauncher(states={n: [JobState.RUNNING] for n in MEASURES}, on_info=interrupt)
    s = start(tmp_path, fake, budget={"nodes_in_flight": 3})
    assert s.run() == 130
    assert fake.launched == ["1p1d"]
    state = SearchDir(s.sdir.path).read_state()
    assert state["1p1d"].status == "cancelled" and "SIGINT" in state["1p1d"].reason
    assert fake.jobs["1p1d"].states == [JobState.CANCELLED]
    assert s.sdir.report_md.is_file()


def test_a_resume_re_attaches_to_a_job_left_running(tmp_path: Path) -> None:
    """A search stopped while its local job ran: the job ended meanwhile; the resume reads it, launching nothing."""
    s = start(tmp_path, FakeLauncher(), budget={"max_jobs": 1})
    assert s.run() == 0
    done = s.sdir.states["1p1d"]
    assert done.run is not None
    run = RunDir(s.sdir.path / done.run)
    # As the search left it when it was killed: running, its launcher a process that is gone now.
    record = {"launcher": "local", "job_id": "local-x", "host": socket.gethostname(), "time": time.time()}
    atomic.write_json(run.launch_record, record | {"pid": os.getpid(), "create_time": 1.0})
    s.sdir.put(done.update(status="running", outcome=None, ended_at=None))

    fake = FakeLauncher()
    again = start(tmp_path, fake, budget={"max_jobs": 1})
    assert again.run() == 0
    assert fake.launched == []
    state = SearchDir(again.sdir.path).read_state()["1p1d"]
    assert state.status == "done" and state.run == done.run and state.outcome is not None


def test_pruning_gives_every_candidate_a_reason(tmp_path: Path) -> None:
    fake = FakeLauncher()
    s = start(tmp_path, fake, prune={"enabled": True, "slack": 1.1}, budget={"nodes_in_flight": 3})
    assert s.run() == 0
    state = SearchDir(s.sdir.path).read_state()
    for name in ("1p1d", "1p2d", "2p1d"):
        assert state[name].status in ("done", "skipped") and state[name].reason, state[name]
    assert state["1p1d"].status == "done"  # the first has nothing to be pruned by


class ForegroundLauncher(FakeLauncher):
    """As the local launcher: launch() returns once the job has ended."""

    foreground = True


def test_a_foreground_launcher_runs_one_job_at_a_time_to_its_end(tmp_path: Path) -> None:
    fake = ForegroundLauncher(states={n: [JobState.COMPLETED] for n in MEASURES})
    s = start(tmp_path, fake, budget={"nodes_in_flight": 8})
    assert s.run() == 0
    assert fake.launched == ["1p1d", "1p2d", "2p1d", "agg3"]
    assert all(j.polls == 1 for j in fake.jobs.values())  # each read once, after it ended
    assert statuses(s)["2p1d"] == "done"


def test_a_job_past_its_time_limit_is_cancelled_and_recorded(tmp_path: Path) -> None:
    fake = FakeLauncher(states={n: [JobState.RUNNING] for n in MEASURES})
    s = start(tmp_path, fake, budget={"max_jobs": 1})
    s.margin_s = -1800.0  # the recipe's timeouts.job_s is 1800: no time left once it runs
    assert s.run() == 1
    state = SearchDir(s.sdir.path).read_state()["1p1d"]
    assert state.status == "failed" and "timeouts.job_s" in state.reason and state.reason.endswith("cancelled")
    assert fake.jobs["1p1d"].states == [JobState.CANCELLED]


def test_sigterm_taken_by_a_foreground_launcher_stops_the_search(tmp_path: Path) -> None:
    """The local launcher handles SIGTERM itself while its job runs (exit 143): unless it was
    `pdbench cancel` (the job then reads cancelled), the signal was for the search."""
    fake = ForegroundLauncher(states={"1p1d": [JobState.FAILED]})
    fake.returncodes["1p1d"] = 128 + signal.SIGTERM
    s = start(tmp_path, fake)
    assert s.run() == 130
    assert fake.launched == ["1p1d"]
    state = SearchDir(s.sdir.path).read_state()
    assert state["1p1d"].status == "cancelled" and "SIGTERM" in state["1p1d"].reason
    assert state["1p2d"].status == "planned"


def test_a_second_search_process_in_the_directory_is_refused(tmp_path: Path) -> None:
    s = start(tmp_path, FakeLauncher())
    with s.sdir.locked(), pytest.raises(Refused, match=f"a search runs in it already \\(pid {os.getpid()}\\)"):
        start(tmp_path, FakeLauncher()).run()
    assert s.run() == 0  # released


def test_a_job_that_failed_after_its_ladder_search_ended_counts_as_done(tmp_path: Path) -> None:
    """The client exits 1 when a measured point had failed requests: the job fails, but the
    ladder search's answer (slo_search.json done) stands."""
    fake = FakeLauncher(states={"1p1d": [JobState.RUNNING, JobState.FAILED]})
    fake.done = {"1p1d"}
    s = start(tmp_path, fake, budget={"max_jobs": 1})
    assert s.run() == 0
    state = SearchDir(s.sdir.path).read_state()["1p1d"]
    assert state.status == "done" and state.reason.endswith("the job then failed: a node failed)")
    assert "best c=2" in state.reason


def _poll_gaps(tmp_path: Path, poll_s: float) -> list[float]:
    """Seconds between the launcher's answers on 1p1d's job: running twice after its nodes
    recorded the end (the fake writes status.json at launch), then completed."""
    asked: list[float] = []
    fake = FakeLauncher(
        states={"1p1d": [JobState.RUNNING, JobState.RUNNING, JobState.COMPLETED]},
        on_info=lambda name, n: asked.append(time.monotonic()) if name == "1p1d" else None,
    )
    s = start(tmp_path, fake, budget={"max_jobs": 1})
    s.poll_s = poll_s
    assert s.run() == 0
    assert statuses(s)["1p1d"] == "done" and len(asked) == 3
    return [b - a for a, b in itertools.pairwise(asked)]


def test_a_job_whose_nodes_recorded_its_end_is_asked_again_within_a_second(tmp_path: Path) -> None:
    """The next candidate need not wait out poll_s behind Slurm's teardown."""
    gaps = _poll_gaps(tmp_path, poll_s=10.0)
    assert all(0.9 <= g < 5.0 for g in gaps), gaps


def test_an_end_recorded_long_ago_is_polled_at_poll_s_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launcher slow to report the end is not asked every second for ever."""
    monkeypatch.setattr("harness.search.driver.END_WAIT_S", 0.0)
    gaps = _poll_gaps(tmp_path, poll_s=1.5)
    assert all(g >= 1.4 for g in gaps), gaps


def _cancelled_while_queued(tmp_path: Path, started: bool) -> float:
    """Seconds from the launch of 1p2d's job, cancelled while queued (no status.json), to its
    end recorded, its nodes having left a record or not."""

    def on_info(name: str, n: int) -> None:
        if name == "1p2d":
            run = fake.jobs[name].run
            run.status.unlink(missing_ok=True)
            if started:
                run.nodes.mkdir(exist_ok=True)
                (run.nodes / "0.json").write_text("{}")

    fake = FakeLauncher(states={"1p2d": [JobState.PENDING, JobState.CANCELLED]}, on_info=on_info)
    tmp_path.mkdir()
    s = start(tmp_path, fake, budget={"nodes_in_flight": 3})
    assert s.run() == 1
    state = SearchDir(s.sdir.path).read_state()["1p2d"]
    assert state.status == "cancelled" and state.reason.endswith("was cancelled (CANCELLED)"), state
    assert state.started_at is not None and state.ended_at is not None
    return state.ended_at - state.started_at


def test_a_job_cancelled_while_queued_is_recorded_without_waiting_for_a_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No node ran, so nothing will write its status.json: no STATUS_SETTLE_S wait for one."""
    monkeypatch.setattr("harness.search.driver.STATUS_SETTLE_S", 3.0)
    assert _cancelled_while_queued(tmp_path / "queued", started=False) < 1.5
    # A job whose nodes started may still be writing it (NFS shows it late): waited for.
    assert _cancelled_while_queued(tmp_path / "started", started=True) >= 3.0


def test_a_flag_vllm_rejects_fails_its_candidate_before_the_first_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every candidate's serve lines are checked up front, pruned ones too, not at its turn."""
    refused_while: list[list[str]] = []  # what had been launched when 2p1d's lines were refused
    fake = FakeLauncher()

    def check_flags(p: Any, skip: bool) -> None:
        if p.rr.recipe.topology.prefill.workers == 2:
            refused_while.append(list(fake.launched))
            raise Refused("vLLM rejects a flag: topology.prefill.flags.x: --x: unrecognized arguments: --x")

    monkeypatch.setattr("harness.search.driver.check_flags", check_flags)
    s = start(tmp_path, fake, budget={"nodes_in_flight": 3})
    s.skip_flag_check = False
    assert s.run() == 1
    assert refused_while == [[]], refused_while
    assert "2p1d" not in fake.launched and fake.launched[:2] == ["1p1d", "1p2d"]
    state = SearchDir(s.sdir.path).read_state()["2p1d"]
    assert state.status == "failed" and state.reason.startswith("not launched: vLLM rejects a flag: "), state
