"""Slurm launcher units: state from sacct or, without accounting, scontrol/squeue, in the
launchers' common states; the launch record; the status, logs and cancel commands. Fake
Slurm commands on PATH isolate the parsing."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import topology
from harness.config import load_recipe
from harness.launch import slurm
from harness.launch.find import NoJob, job_of
from harness.launch.job import JobInfo, JobState, LaunchError
from harness.launch.record import LaunchRecord
from harness.rundir import RunDir
from harness.topology import PlanFile


def _fake(bin_dir: Path, name: str, script: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/bash\n" + script)
    p.chmod(0o755)


@pytest.fixture()
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")
    return d


def test_state_from_sacct(fake_bin: Path) -> None:
    _fake(fake_bin, "sacct", 'echo "CANCELLED by 0|0:15|None|node[1-2]"\n')
    info = slurm.job_info("7")
    assert (info.state, info.exit_code, info.nodes, info.source) == ("CANCELLED", "0:15", "node[1-2]", "sacct")
    assert info.finished


def test_without_accounting_falls_back_to_scontrol(fake_bin: Path) -> None:
    _fake(fake_bin, "sacct", 'echo "Slurm accounting storage is disabled" >&2; exit 1\n')
    _fake(
        fake_bin, "scontrol", 'echo "JobId=7 JobName=x JobState=RUNNING Reason=None ExitCode=0:0 NodeList=node[1-3]"\n'
    )
    info = slurm.job_info("7")
    assert (info.state, info.nodes, info.source) == ("RUNNING", "node[1-3]", "scontrol")
    assert not info.finished


def test_forgotten_job_falls_back_to_squeue_then_unknown(fake_bin: Path) -> None:
    _fake(fake_bin, "scontrol", 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n')
    _fake(fake_bin, "squeue", "exit 0\n")
    assert slurm.job_info("7").state == "UNKNOWN"
    _fake(fake_bin, "squeue", 'echo "PENDING|Resources|"\n')
    assert slurm.job_info("7").state == "PENDING"


def test_slurm_states_in_common_terms(fake_bin: Path, tmp_path: Path) -> None:
    job = slurm.SlurmJob(RunDir(tmp_path), "7")
    expected = {
        "PENDING": JobState.PENDING,
        "CONFIGURING": JobState.PENDING,
        "RUNNING": JobState.RUNNING,
        "COMPLETING": JobState.RUNNING,  # steps still being torn down: not finished
        "COMPLETED": JobState.COMPLETED,
        "NODE_FAIL": JobState.FAILED,
        "OUT_OF_MEMORY": JobState.FAILED,
        "CANCELLED": JobState.CANCELLED,
        "TIMEOUT": JobState.TIMEOUT,
        "SOMETHING_NEW": JobState.RUNNING,  # a state Slurm adds later: known, not ended
    }
    for native, state in expected.items():
        _fake(fake_bin, "scontrol", f'echo "JobId=7 JobState={native} ExitCode=0:0"\n')
        info = job.info()
        assert (info.state, info.detail) == (state, native)
    _fake(fake_bin, "scontrol", "exit 1\n")
    _fake(fake_bin, "squeue", "exit 0\n")
    assert job.state() is JobState.UNKNOWN
    assert all(slurm.STATES[s].finished for s in slurm.TERMINAL)


def test_submit_records_the_launch_and_reports_errors(fake_bin: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _fake(fake_bin, "sbatch", 'echo "42;cluster"\n')
    with pytest.raises(NoJob, match=r"launch\.json is missing"):
        job_of(RunDir(run))
    assert slurm.submit(run) == "42"
    record = json.loads(RunDir(run).launch_record.read_text())
    assert (record["launcher"], record["job_id"]) == ("slurm", "42") and record["host"]
    job = job_of(RunDir(run))
    assert isinstance(job, slurm.SlurmJob) and (job.job_id, job.title) == ("42", "Slurm job 42")
    _fake(fake_bin, "sbatch", 'echo "sbatch: error: invalid partition specified: gpu" >&2; exit 1\n')
    with pytest.raises(LaunchError, match="invalid partition"):
        slurm.submit(run)


def test_a_run_from_before_the_launch_record_is_a_slurm_job(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.legacy_slurm_job_id.write_text("9\n")
    job = job_of(run)
    assert isinstance(job, slurm.SlurmJob) and job.job_id == "9"
    LaunchRecord.now("slurm", "10").write(run)  # the launch record wins over the old file
    assert job_of(run).job_id == "10"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{not json", "not a readable launch record"),
        ('["slurm"]', "a JSON object"),
        ('{"launcher": "slurm", "host": "h", "time": 1}', "key 'job_id'"),
        ('{"launcher": "pbs", "job_id": "1", "host": "h", "time": 1}', "key 'launcher' is 'pbs'"),
        ('{"launcher": "local", "job_id": "l", "host": "h", "time": 1, "pid": 5}', "'pid' and 'create_time'"),
    ],
)
def test_a_bad_launch_record_is_named(tmp_path: Path, text: str, named: str) -> None:
    run = RunDir(tmp_path)
    run.launch_record.write_text(text)
    with pytest.raises(LaunchError, match=f"{run.launch_record}: .*{named}"):
        job_of(run)


def test_wait_follows_to_the_end(fake_bin: Path, tmp_path: Path) -> None:
    counter = tmp_path / "n"
    _fake(
        fake_bin,
        "scontrol",
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}\n"
        'if [ "$n" -lt 2 ]; then s=RUNNING; else s=COMPLETED; fi\n'
        'echo "JobId=7 JobState=$s ExitCode=0:0"\n',
    )
    seen: list[str] = []
    job = slurm.SlurmJob(RunDir(tmp_path), "7")
    info = job.wait(timeout_s=30, on_poll=lambda i: seen.append(i.detail), poll_s=0.01)
    assert info.state is JobState.COMPLETED and seen == ["RUNNING", "RUNNING", "COMPLETED"]


def test_wait_asks_again_within_a_second_once_the_run_records_its_end(fake_bin: Path, tmp_path: Path) -> None:
    """The nodes write status.json's end before Slurm's teardown ends the job: a follower far
    into a long poll interval asks Slurm again within END_POLL_S, not at its next interval."""
    counter, run = tmp_path / "n", RunDir(tmp_path)
    _fake(
        fake_bin,
        "scontrol",
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}\n"
        'if [ "$n" -lt 2 ]; then s=RUNNING; else s=COMPLETED; fi\n'
        'echo "JobId=7 JobState=$s ExitCode=0:0"\n',
    )
    asked: list[float] = []

    def on_poll(info: JobInfo) -> None:
        asked.append(time.monotonic())
        if len(asked) == 1:  # the nodes record the end while Slurm still says RUNNING
            run.status.write_text(json.dumps({"state": "succeeded", "finished_at": time.time()}))

    info = slurm.SlurmJob(run, "7").wait(timeout_s=60, on_poll=on_poll, poll_s=10.0)
    assert info.state is JobState.COMPLETED and len(asked) == 3
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert all(g < 5.0 for g in gaps), gaps  # 10 s apart without the recorded end


def test_wait_deadline_counts_from_the_start_not_the_queue(fake_bin: Path, tmp_path: Path) -> None:
    """A job that waits in the queue longer than its own time is not failed for it; one that
    runs past the deadline is (and is not cancelled)."""
    counter = tmp_path / "n"
    _fake(
        fake_bin,
        "scontrol",
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}\n"
        'if [ "$n" -lt 30 ]; then s=PENDING; elif [ "$n" -lt 32 ]; then s=RUNNING; else s=COMPLETED; fi\n'
        'echo "JobId=7 JobState=$s ExitCode=0:0"\n',
    )
    seen: list[str] = []
    job = slurm.SlurmJob(RunDir(tmp_path), "7")
    info = job.wait(timeout_s=0.2, on_poll=lambda i: seen.append(i.detail), poll_s=0.01)
    assert info.state is JobState.COMPLETED and seen.count("PENDING") == 30, seen
    _fake(fake_bin, "scontrol", 'echo "JobId=8 JobState=RUNNING ExitCode=0:0"\n')
    with pytest.raises(LaunchError, match="still RUNNING 0 s after it started; not cancelled"):
        slurm.SlurmJob(RunDir(tmp_path), "8").wait(timeout_s=0.1, poll_s=0.01)


def test_a_silent_sacct_is_answered_by_scontrol(fake_bin: Path, tmp_path: Path, monkeypatch) -> None:
    """sacct asks slurmdbd, scontrol slurmctld: when the first does not answer in time (a busy
    slurmdbd), the job's state comes from the second, not an error."""
    monkeypatch.setattr(slurm, "QUERY_S", 0.5)
    _fake(fake_bin, "sacct", "sleep 5\n")
    _fake(fake_bin, "scontrol", 'echo "JobId=7 JobState=RUNNING ExitCode=0:0"\n')
    t0 = time.monotonic()
    info = slurm.job_info("7")
    assert (info.state, info.source) == ("RUNNING", "scontrol")
    assert time.monotonic() - t0 < 4.0  # sacct's query was cut at QUERY_S, not waited out


def test_wait_asks_a_silent_slurm_again_and_gives_up_after_silent_s(
    fake_bin: Path, tmp_path: Path, monkeypatch
) -> None:
    """A follower (`submit --wait`) does not end on one query that timed out: it asks again at
    the next poll and follows the job to its end; only a launcher silent for silent_s fails it."""
    monkeypatch.setattr(slurm, "QUERY_S", 0.3)
    counter = tmp_path / "n"
    _fake(fake_bin, "sacct", "exit 1\n")  # accounting has no record: scontrol answers
    _fake(
        fake_bin,
        "scontrol",
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}\n"
        'if [ "$n" -eq 1 ] || [ "$n" -eq 2 ]; then sleep 3; fi\n'  # two polls unanswered
        'if [ "$n" -lt 4 ]; then s=RUNNING; else s=COMPLETED; fi\n'
        'echo "JobId=7 JobState=$s ExitCode=0:0"\n',
    )
    _fake(fake_bin, "squeue", "sleep 3\n")
    seen: list[str] = []
    info = slurm.SlurmJob(RunDir(tmp_path), "7").wait(
        timeout_s=60, on_poll=lambda i: seen.append(i.detail), poll_s=0.01
    )
    assert info.state is JobState.COMPLETED and seen == ["RUNNING", "RUNNING", "COMPLETED"], seen
    _fake(fake_bin, "scontrol", "sleep 3\n")
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="did not answer within 0 s, and no answer for 1 s since"):
        slurm.SlurmJob(RunDir(tmp_path), "8").wait(timeout_s=60, poll_s=0.01, silent_s=1.0)
    assert 1.0 <= time.monotonic() - t0 < 10.0


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "results" / "r1" / "20260101T000000Z-abc123"
    (run / "logs").mkdir(parents=True)
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d")  # prefill-0 and the proxy on node 0, decode-0 on node 1
    plan = PlanFile.of(rr, topology.plan(rr)).to_json()
    (run / "plan.json").write_text(json.dumps(plan))
    for name in ("prefill-0", "decode-0", "proxy", "bench", "node0", "node1"):
        (run / "logs" / f"{name}.log").write_text(f"{name} line 1\n{name} line 2\n")
    return run


def test_log_selection_by_node_and_role(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    names = lambda **kw: [p.name for p in RunDir(run).log_files(**kw)]  # noqa: E731
    assert names(role="decode") == ["decode-0.log"]
    assert names(node=0) == ["prefill-0.log", "proxy.log", "bench.log", "node0.log"]
    assert names(node=1, role="node") == ["node1.log"]
    assert RunDir.resolve("r1", tmp_path / "results").path == run.resolve()


def test_logs_status_cancel_commands(tmp_path: Path, fake_bin: Path) -> None:
    run = _run_dir(tmp_path)
    LaunchRecord.now("slurm", "9").write(RunDir(run))
    (run / "status.json").write_text(json.dumps({"state": "failed", "reason": "decode-0 died"}))
    _fake(fake_bin, "scontrol", 'echo "JobId=9 JobState=FAILED ExitCode=1:0 NodeList=node[1-2]"\n')
    _fake(fake_bin, "scancel", f'echo "$@" > {tmp_path}/cancelled\n')
    env = dict(os.environ)
    cli = [sys.executable, "-m", "harness"]
    r = subprocess.run(
        [*cli, "logs", str(run), "--role", "proxy", "-n", "1"], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0 and "==> logs/proxy.log <==\nproxy line 2" in r.stdout
    r = subprocess.run([*cli, "status", str(run)], capture_output=True, text=True, env=env, timeout=60)
    assert "slurm job 9: FAILED" in r.stdout and "reason: decode-0 died" in r.stdout
    r = subprocess.run(
        [*cli, "cancel", "r1", "--results-dir", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0 and (tmp_path / "cancelled").read_text().strip() == "9"
    r = subprocess.run([*cli, "logs", str(tmp_path / "nope")], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "no run directory" in r.stderr
