"""The embedded local launcher: the rendered job on this machine, no Slurm needed.

It does what `srun` does for the job: one process per node running server.sh, each
with the SLURM_* variables a real allocation gives, all on this host (127.0.0.1).
Like `srun --kill-on-bad-exit`, a node that fails ends the others (after they had
the chance to tear down by themselves). The job runs in the foreground of the process that
launches it; that process records itself (RunDir.launch_record) before it starts any node,
so `pdbench status` and `cancel` find it from another shell: cancelling it is a SIGTERM, on
which it records the cause and stops every node.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

import psutil

from harness import exit_codes
from harness.config.load import ResolvedRecipe
from harness.launch.health_wait import HealthWait
from harness.launch.job import Job, JobInfo, JobState, LaunchError
from harness.launch.launcher import Launcher
from harness.launch.log_tail import LogTail
from harness.launch.record import LaunchRecord, read_record
from harness.rundir import Failure, FailureRecords, RunDir, read_status, write_status
from harness.supervisor import group_members, kill_recorded, live_recorded, stop_groups
from harness.topology import JobPlan, PlanFile, check_single_host

log = logging.getLogger(__name__)


def node_env(run_dir: Path, job_id: str, node: int, num_nodes: int) -> dict[str, str]:
    # The node runs pdbench with PDBENCH_PYTHON (default: this interpreter), and that
    # environment's bin directory comes first on PATH, so `vllm` is the one installed beside it.
    python = os.environ.get("PDBENCH_PYTHON") or sys.executable
    env = dict(os.environ)
    env.update(
        {
            "PATH": str(Path(python).parent) + os.pathsep + env.get("PATH", ""),
            "PDBENCH_PYTHON": python,
            "PDBENCH_NODE_ADDR": "127.0.0.1",
            "PDBENCH_LAUNCHER": "local",
            "RUN_DIR": str(run_dir),
            "SLURM_JOB_ID": job_id,
            "SLURM_JOB_NAME": f"pdbench-{run_dir.parent.name}",
            "SLURM_JOB_NUM_NODES": str(num_nodes),
            "SLURM_NNODES": str(num_nodes),
            "SLURM_NTASKS": str(num_nodes),
            "SLURM_JOB_NODELIST": f"local[0-{num_nodes - 1}]" if num_nodes > 1 else "local0",
            "SLURM_NODEID": str(node),
            "SLURM_PROCID": str(node),
            "SLURM_LOCALID": "0",
            "SLURMD_NODENAME": f"local{node}",
        }
    )
    return env


def local_job_id(run_dir: Path) -> str:
    return f"local-{run_dir.name}"


def run_local(run_dir: Path, num_nodes: int, timeout_s: float, grace_s: float, echo: TextIO | None = sys.stdout) -> int:
    """Run every node of the job; returns the job's exit status (0 when every node succeeded)."""
    job_id = local_job_id(run_dir)
    run = RunDir(run_dir)
    run.logs.mkdir(exist_ok=True)
    nodes: list[subprocess.Popen] = []
    tail = LogTail.progress(run, echo) if echo else None
    health = HealthWait(run, echo) if echo else None
    rc = 0
    # The launcher records why it stops the job before it signals any node, so no node can
    # mistake the launcher's SIGTERM for the cause.
    failures = FailureRecords(run)
    # Signal handlers can only be set from the main thread (tests run the launcher in others).
    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)} if in_main else {}
    try:
        # Recorded before any node starts, and once a SIGTERM (`pdbench cancel`) would stop them.
        me = psutil.Process()
        record = LaunchRecord.now("local", job_id, me.pid, me.create_time())
        record.write(run)
        for i in range(num_nodes):
            # The node runtime logs to logs/node<i>.log itself; this keeps anything else it prints.
            with open(run.node_output(i), "ab") as out:
                nodes.append(
                    subprocess.Popen(
                        ["bash", str(run.server_script)],
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=node_env(run_dir, job_id, i, num_nodes),
                        cwd=run_dir,
                        start_new_session=True,
                    )
                )
        # Each node leads its own process group: recorded, so that `cancel` stops them also when
        # this launcher is gone (SIGKILLed), and never a later process that reuses a PID.
        record.with_nodes([(p.pid, psutil.Process(p.pid).create_time()) for p in nodes]).write(run)
        log.info("local job %s: %d node process(es), pids %s", job_id, num_nodes, [p.pid for p in nodes])
        deadline = time.monotonic() + timeout_s
        first_failure_at: float | None = None
        while any(p.poll() is None for p in nodes):
            if tail and health:
                tail.pump()
                health.pump()
            codes = [p.poll() for p in nodes]
            if first_failure_at is None and any(c not in (None, 0) for c in codes):
                first_failure_at = time.monotonic()
            if first_failure_at is not None and time.monotonic() - first_failure_at > grace_s + 30:
                log.error("a node failed; stopping the others")
                failed = next(i for i, c in enumerate(codes) if c not in (None, 0))
                failures.record(
                    Failure(
                        "launcher",
                        f"node {failed} exited with code {codes[failed]} "
                        "and the other nodes did not stop by themselves",
                    )
                )
                break
            if time.monotonic() > deadline:
                log.error("the job exceeded its time limit of %.0f s; stopping it", timeout_s)
                failures.record(Failure("launcher", f"the job reached its time limit of {timeout_s:.0f} s"))
                rc = exit_codes.TIMED_OUT
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        log.error("interrupted; stopping every node")
        failures.record(Failure("launcher", "interrupted by the user (Ctrl-C)"))
        rc = exit_codes.INTERRUPTED
    except _Terminated as e:
        log.error("received %s; stopping every node", signal.Signals(e.signum).name)
        failures.record(Failure("launcher", f"received {signal.Signals(e.signum).name}"))
        rc = 128 + e.signum
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # teardown must not be cut short
        stop_groups(nodes, grace_s + 30)  # each node runtime tears down its own processes on SIGTERM
        _sweep_leftovers(run_dir)
        if tail:
            tail.pump()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # A time limit or a signal is the launcher's own outcome: it stands over any status a node
    # wrote meanwhile (node 0 can finish writing "exit 1, its server died" from the same SIGTERM
    # before it handles its own), with the cause recorded first (`pdbench cancel` records its own).
    stopped_here = rc != 0
    if rc == 0:
        rc = next((c for c in (p.returncode for p in nodes) if c), 0)
    if stopped_here or not run.status.is_file():
        # Else the head node was killed before it could write the job's status.
        failure = failures.first()
        if rc and failure is None:
            failure = Failure(
                "launcher", f"node processes exited with codes {[p.returncode for p in nodes]} and recorded no reason"
            )
        write_status(run, rc, failure if rc else None)
    return rc


class _Terminated(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, _frame: object) -> None:
    raise _Terminated(signum)


def _sweep_leftovers(run_dir: Path) -> None:
    """Kill what a node runtime recorded but could not reap (it was SIGKILLed, say)."""
    for line in kill_recorded(RunDir(run_dir).proc_records()):
        log.warning("killed leftovers of %s", line)


# The cause `pdbench cancel` records before it signals a local launcher: the run's reason,
# and how its state tells a cancelled run from a failed one.
CANCELLED = "cancelled (pdbench cancel)"


class LocalJob(Job):
    """A job the local launcher runs: running while its recorded launcher process lives,
    then what the run recorded (status.json, else the failure records)."""

    launcher = "local"

    def __init__(self, run: RunDir, record: LaunchRecord, returncode: int | None = None):
        super().__init__(run, record.job_id)
        self.record = record
        self.returncode = returncode  # known when the job ran in this process

    @property
    def title(self) -> str:
        return f"local job {self.job_id} (pid {self.record.pid} on {self.record.host})"

    def _process(self) -> psutil.Process | None:
        """The live launcher process, unless it ended (or its PID now names another process)."""
        if self.returncode is not None or self.record.host != socket.gethostname() or self.record.pid is None:
            return None
        try:
            p = psutil.Process(self.record.pid)
            if abs(p.create_time() - (self.record.create_time or 0.0)) > 0.1 or p.status() == psutil.STATUS_ZOMBIE:
                return None
            return p
        except psutil.NoSuchProcess:
            return None

    def info(self) -> JobInfo:
        if self._process() is not None or self._orphaned_nodes():
            return JobInfo(JobState.RUNNING, "RUNNING", nodes=self.record.host, source="process")
        status = read_status(self.run)
        if status is None:
            return JobInfo(JobState.UNKNOWN, "UNKNOWN", nodes=self.record.host, returncode=self.returncode)
        state = {"succeeded": JobState.COMPLETED, "timeout": JobState.TIMEOUT}.get(status["state"], JobState.FAILED)
        if state is JobState.FAILED and (status.get("failure") or {}).get("cause") == CANCELLED:
            state = JobState.CANCELLED
        rc = self.returncode if self.returncode is not None else status.get("exit_code")
        return JobInfo(state, state.name, None if rc is None else str(rc), None, self.record.host, "status", rc)

    def cancel(self) -> None:
        p = self._process()
        if p is None:
            if self._stop_orphaned_nodes():
                return
            state = self.state()
            if not state.finished and self.record.host != socket.gethostname():
                raise LaunchError(f"{self.title} runs on another host; cancel it there")
            raise LaunchError(f"{self.title} is not running (it is {state.value})")
        # The cause first, so the launcher's own record of the SIGTERM does not become the reason.
        FailureRecords(self.run).record(Failure("launcher", CANCELLED))
        try:
            p.send_signal(signal.SIGTERM)  # psutil checks it is still the recorded process
        except psutil.NoSuchProcess:
            pass

    def _orphaned_nodes(self) -> list[psutil.Process]:
        """The node processes (and theirs) that outlived the launcher, were it SIGKILLed."""
        if self.returncode is not None or self.record.host != socket.gethostname():
            return []
        return [m for pid, created in self.record.nodes for m in group_members(pid, created)]

    def _stop_orphaned_nodes(self) -> bool:
        """Stop what outlived the launcher (it was SIGKILLed): the nodes' process groups it
        recorded, as the launcher would (SIGTERM, so each node tears down and node 0 writes the
        status; SIGKILL past the nodes' own teardown bound), then whatever the nodes recorded and
        did not reap. False when nothing of the run was left to stop."""
        if self.returncode is not None or self.record.host != socket.gethostname():
            return False  # ran in this process, so nothing outlived it; or another host's PIDs
        leaders = {pid for pid, _ in self.record.nodes}
        left = [m for m in self._orphaned_nodes() if _pgid(m) in leaders]  # the nodes, not their servers
        if not left and not any(live_recorded(r) for r in self.run.proc_records()):
            return False
        FailureRecords(self.run).record(Failure("launcher", CANCELLED))
        for m in left:
            _signal(m, signal.SIGTERM)
        timeouts = PlanFile.model_validate_json(self.run.plan.read_text()).timeouts
        _, stubborn = psutil.wait_procs(left, timeout=timeouts.teardown_s + timeouts.settle_s + 15)
        for m in [*stubborn, *self._orphaned_nodes()]:
            _signal(m, signal.SIGKILL)
        for line in kill_recorded(self.run.proc_records()):
            log.warning("killed leftovers of %s", line)
        if read_status(self.run) is None:  # node 0 ended before it could write it
            write_status(self.run, 128 + signal.SIGTERM, FailureRecords(self.run).first())
        return True


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except ProcessLookupError:
        return None


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)  # psutil checks it is still the process it found
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


class LocalLauncher(Launcher):
    name = "local"
    foreground = True
    single_host = True

    def __init__(self, time_limit_s: float, grace_s: float, echo: TextIO | None = sys.stdout):
        self.time_limit_s = time_limit_s
        self.grace_s = grace_s
        self.echo = echo

    def check(self, rr: ResolvedRecipe, plan: JobPlan) -> None:
        check_single_host(rr, plan)

    def dry_run(self, run: RunDir, num_nodes: int) -> str:
        return f"local launcher: would run {num_nodes} node process(es) of {run.server_script}"

    def launch(self, run: RunDir, num_nodes: int) -> LocalJob:
        rc = run_local(run.path, num_nodes, self.time_limit_s, self.grace_s, self.echo)
        record = read_record(run)
        if record is None:
            raise LaunchError(f"{run.launch_record} is missing after the local launcher ran")
        return LocalJob(run, record, rc)
