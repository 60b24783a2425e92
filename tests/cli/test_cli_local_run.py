"""`pdbench status`, `logs`, `cancel` and a follower against a local run, from another shell.

`pdbench submit --launcher local` runs the local 1P1D recipe in a subprocess, its `vllm` a
stand-in that never gets healthy (so the job runs until it is cancelled, bounded by its own
health timeout). While it runs and after it ends, the commands answer from the run's launch
record: the local launcher's PID and create time.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import port_base
from helpers.cli_run import pdbench as _cli

from harness.launch.find import job_of
from harness.launch.job import JobInfo, JobState, LaunchError
from harness.launch.local import CANCELLED, LocalJob
from harness.launch.record import LaunchRecord, read_record
from harness.reaper import DIED
from harness.rundir import RunDir
from harness.submit.follow import follow

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "tiny-fp32-cpu-nixl-1p1d"
pytestmark = pytest.mark.timeout(240)


def _bin(bin_dir: Path) -> Path:
    """`python` (the real one) and a `vllm` that records its PID and never answers, first on the
    nodes' PATH (the local launcher puts PDBENCH_PYTHON's directory there). Like an engine's
    worker that left the server's process group, each starts a grandchild of the node in a
    session of its own (fakepids/escapee.<server pid>: its PID)."""
    bin_dir.mkdir()
    real = shlex.quote(sys.executable)
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\nexec {real} "$@"\n')
    (bin_dir / "vllm").write_text(
        "#!/usr/bin/env bash\n"
        'mkdir -p "$RUN_DIR/fakepids"\n'
        "setsid sleep 600 </dev/null >/dev/null 2>&1 &\n"
        'echo $! > "$RUN_DIR/fakepids/escapee.$$"\n'
        'echo $$ > "$RUN_DIR/fakepids/vllm.$$"\n'
        "exec sleep 600\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir / "python"


def _wait_for(pred, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"pdbench submit exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _started_servers(run: Path) -> list[int]:
    return [int(p.read_text()) for p in (run / "fakepids").glob("vllm.*")] if (run / "fakepids").is_dir() else []


def _escapees(run: Path) -> dict[int, int]:
    """server pid -> the pid of the grandchild it started in a session of its own."""
    d = run / "fakepids"
    return {int(p.suffix[1:]): int(p.read_text()) for p in d.glob("escapee.*")} if d.is_dir() else {}


def _node_runtimes(run: Path) -> list[int]:
    """The node runtimes' pids, from the addresses they announced (nodes/<N>.json)."""
    return [json.loads(p.read_text())["pid"] for p in sorted((run / "nodes").glob("*.json"))]


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after waiting up to `timeout` s (init reaps orphans asynchronously)."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture
def local_run(tmp_path: Path):
    """A local run of the recipe in progress: (submit process, its run directory, results root)."""
    results = tmp_path / "results"
    base = port_base(21500)
    ports = [base, base + 10, base + 20, base + 30]  # apart: a role's workers take ports above its own
    sets = [
        f"topology.prefill.port={ports[0]}",
        f"topology.decode.port={ports[1]}",
        f"connector.side_channel_port={ports[2]}",
        f"proxy.port={ports[3]}",
        "timeouts.health_s=120",  # the stand-in never gets healthy: the job's bound if cancel failed
        "timeouts.teardown_s=5",
    ]
    argv = [sys.executable, "-m", "harness", "submit", "--recipe", RECIPE, "--launcher", "local"]
    argv += ["--skip-flag-check", "--results-dir", str(results)]
    for s in sets:
        argv += ["--set", s]
    env = dict(os.environ, PDBENCH_PYTHON=str(_bin(tmp_path / "bin")))
    out = open(tmp_path / "submit.out", "w+")  # noqa: SIM115 (read back after the process ends)
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    runs = lambda: list((results / RECIPE).glob("*/launch.json")) if (results / RECIPE).is_dir() else []  # noqa: E731
    try:
        _wait_for(runs, 60, "the launch record", proc)
        run = runs()[0].parent
        _wait_for(lambda: len(_escapees(run)) == 2, 90, "both servers to start", proc)
        yield proc, run, results, out
    finally:
        if proc.poll() is None:  # the test failed before the run ended: stop it, then make sure
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for pid in [*_started_servers(run), *_escapees(run).values()] if "run" in locals() else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for pid in _node_runtimes(run) if "run" in locals() else []:  # what a killed launcher left
            if _alive(pid) and str(run) in " ".join(psutil.Process(pid).cmdline()):
                os.killpg(pid, signal.SIGKILL)
        out.close()


def test_status_logs_cancel_of_a_local_run(local_run) -> None:
    proc, run, results, out = local_run
    record = read_record(RunDir(run))
    assert record is not None and (record.launcher, record.pid) == ("local", proc.pid)

    r = _cli("status", str(run))
    assert r.returncode == 0, r.stderr
    assert f"local job local-{run.name}: RUNNING" in r.stdout and "outcome: not finished" in r.stdout, r.stdout

    r = _cli("logs", RECIPE, "--results-dir", str(results), "--role", "node", "--node", "0", "-n", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("==> logs/node0.log <==\n") and "prefill-0" in r.stdout, r.stdout

    # A second shell follows the run while a third cancels it.
    followed: list[JobInfo] = []
    follower = threading.Thread(target=lambda: followed.append(job_of(RunDir(run)).wait(120, poll_s=0.2)))
    follower.start()
    r = _cli("cancel", str(run))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"cancelled local job local-{run.name} (pid {proc.pid} on {socket.gethostname()})"

    rc = proc.wait(60)
    follower.join(60)
    assert rc == 128 + signal.SIGTERM
    out.seek(0)
    printed = out.read()
    assert "FAILED (exit 143)" in printed and f"reason: the local launcher: {CANCELLED}" in printed, printed
    assert [i.state for i in followed] == [JobState.CANCELLED]

    r = _cli("status", str(run))
    assert f"local job local-{run.name}: CANCELLED (exit 143" in r.stdout, r.stdout
    assert "outcome: failed" in r.stdout and f"reason: the local launcher: {CANCELLED}" in r.stdout, r.stdout
    # Nothing of the job is left: the launcher, the servers, every process a node recorded.
    recorded = [e["pid"] for p in RunDir(run).proc_records() for e in json.loads(p.read_text())]
    assert len(recorded) >= 2 and len(_started_servers(run)) == 2
    deadline = time.monotonic() + 10  # init reaps orphans asynchronously
    while (
        left := [p for p in [proc.pid, *_started_servers(run), *_escapees(run).values(), *recorded] if _alive(p)]
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []

    r = _cli("cancel", str(run))
    assert r.returncode == 1 and "is not running (it is cancelled)" in r.stderr, r.stderr


def test_ctrl_c_of_a_local_submit_prints_a_resume_command_that_runs(local_run) -> None:
    proc, run, _results, out = local_run
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends the foreground group on ^C
    assert proc.wait(60) == 130
    out.seek(0)
    printed = out.read()
    assert "FAILED (exit 130)" in printed, printed
    (line,) = [x for x in printed.splitlines() if x.startswith("resume: ")]
    command = line.removeprefix("resume: ")
    assert command.endswith(f" --resume {run}") and " submit " in f" {command}", command
    # As printed, from where it was printed (a dry run: the command is accepted, nothing runs).
    r = subprocess.run(
        ["bash", "-c", f"{command} --dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ, PDBENCH_PYTHON=str(Path(run).parents[2] / "bin" / "python")),
    )
    assert r.returncode == 0, r.stderr
    assert "dry run: nothing submitted" in r.stdout, r.stdout


def test_cancel_stops_the_nodes_of_a_killed_launcher(local_run) -> None:
    proc, run, _results, _out = local_run
    nodes = _node_runtimes(run)
    os.kill(proc.pid, signal.SIGKILL)  # the launcher only, not its nodes' process groups
    assert proc.wait(10) == -signal.SIGKILL
    job = [*nodes, *_started_servers(run), *_escapees(run).values()]
    assert len(job) == 6 and all(_alive(p) for p in job)  # the nodes run on without it

    r = _cli("status", str(run))
    assert f"local job local-{run.name}: RUNNING" in r.stdout, r.stdout
    r = _cli("cancel", str(run))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"cancelled local job local-{run.name} (pid {proc.pid} on {socket.gethostname()})"
    recorded = [e["pid"] for p in RunDir(run).proc_records() for e in json.loads(p.read_text())]
    assert len(recorded) >= 2
    assert _wait_gone([*job, *recorded], 10) == []
    status = json.loads((run / "status.json").read_text())
    assert status["exit_code"] == 143 and status["failure"]["cause"] == CANCELLED, status
    r = _cli("status", str(run))
    assert f"local job local-{run.name}: CANCELLED (exit 143" in r.stdout, r.stdout
    r = _cli("cancel", str(run))
    assert r.returncode == 1 and "is not running (it is cancelled)" in r.stderr, r.stderr


def test_a_killed_node_takes_its_servers_descendants_along(local_run) -> None:
    proc, run, _results, _out = local_run
    node1 = _node_runtimes(run)[1]
    decode = next(e["pid"] for e in json.loads((run / "state" / "procs-node1.json").read_text()))
    escapee = _escapees(run)[decode]  # decode-0's grandchild in a session of its own
    assert _alive(decode) and _alive(escapee)
    os.kill(node1, signal.SIGKILL)  # no teardown of its own
    # The launcher's last-resort sweep would not find the escapee: it is in no recorded group.
    assert _wait_gone([decode, escapee], 15) == []
    # The node's death is the job's cause, recorded at once: node 0 stops on it instead of
    # waiting out its 120 s health bound, and the status names node 1.
    assert proc.wait(60) != 0
    status = json.loads((run / "status.json").read_text())
    assert status["failure"]["node"] == 1 and status["failure"]["cause"] == DIED, status


def _ended_run(tmp_path: Path, status: dict | None, pid: int, create_time: float, host: str | None = None) -> RunDir:
    run = RunDir(tmp_path)
    record = LaunchRecord.now("local", f"local-{tmp_path.name}", pid, create_time)
    (
        record if host is None else LaunchRecord(record.launcher, record.job_id, host, record.time, pid, create_time)
    ).write(run)
    if status is not None:
        run.status.write_text(json.dumps(status))
    return run


def test_a_reused_pid_is_not_the_launcher(tmp_path: Path) -> None:
    me = psutil.Process()
    run = _ended_run(tmp_path, None, me.pid, me.create_time())
    assert job_of(run).state() is JobState.RUNNING  # precondition: this very process counts as it
    run = _ended_run(tmp_path, None, me.pid, me.create_time() - 100)  # same PID, another process
    assert job_of(run).state() is JobState.UNKNOWN
    with pytest.raises(LaunchError, match="is not running"):
        job_of(run).cancel()
    run = _ended_run(tmp_path, None, me.pid, me.create_time(), host="elsewhere")
    with pytest.raises(LaunchError, match="runs on another host; cancel it there"):
        job_of(run).cancel()


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ({"state": "succeeded", "exit_code": 0}, JobState.COMPLETED),
        ({"state": "timeout", "exit_code": 1}, JobState.TIMEOUT),
        ({"state": "failed", "exit_code": 1, "failure": {"node": 0, "cause": "died"}}, JobState.FAILED),
        (
            {"state": "failed", "exit_code": 143, "failure": {"node": "launcher", "cause": CANCELLED}},
            JobState.CANCELLED,
        ),
    ],
)
def test_an_ended_local_run_answers_from_its_status(tmp_path: Path, status: dict, state: JobState) -> None:
    run = _ended_run(tmp_path, {**status, "finished_at": time.time(), "reason": "r"}, 1, 0.0)
    job = job_of(run)
    assert isinstance(job, LocalJob)
    info = job.info()
    assert (info.state, info.returncode, info.source) == (state, status["exit_code"], "status")


def test_follow_of_an_ended_local_run(tmp_path: Path, capsys) -> None:
    status = {"state": "failed", "exit_code": 143, "failure": {"node": "launcher", "cause": CANCELLED}}
    run = _ended_run(tmp_path, {**status, "reason": f"the local launcher: {CANCELLED}", "finished_at": 1.0}, 1, 0.0)
    assert follow(job_of(run), timeout_s=5) == 1
    printed = capsys.readouterr().out
    assert (
        f"job local-{tmp_path.name}: CANCELLED" in printed and f"job local-{tmp_path.name} ended: CANCELLED" in printed
    )
    assert f"reason: the local launcher: {CANCELLED}" in printed
