"""The Slurm launcher: sbatch a rendered job, ask Slurm its state, scancel it.

Job state comes from sacct when accounting is on, else from scontrol (and squeue), as
on clusters (and CI clusters) that run without slurmdbd. Every call has a timeout.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.launch.job import Job, JobInfo, JobState, LaunchError, LauncherSilent
from harness.launch.launcher import Launcher
from harness.launch.record import LaunchRecord
from harness.rundir import RunDir

# Job states after which nothing of the job runs any more. scontrol reports a job whose
# steps are still being torn down as COMPLETING, which is not in this set.
TERMINAL = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)


@dataclass(frozen=True)
class SlurmInfo:
    job_id: str
    state: str  # Slurm's state name, or UNKNOWN when Slurm no longer knows the job
    exit_code: str | None = None
    reason: str | None = None
    nodes: str | None = None
    source: str = "scontrol"

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL


# How long one query of Slurm (sacct, scontrol, squeue, scancel) may take.
QUERY_S = 30.0


def _run(cmd: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    timeout = QUERY_S if timeout is None else timeout
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LauncherSilent(f"{shlex.join(cmd)} did not answer within {timeout:.0f} s") from None
    except FileNotFoundError:
        raise LaunchError(f"{cmd[0]} is not on PATH") from None


def sbatch_command(run_dir: Path, extra: list[str] | None = None) -> list[str]:
    # Every option lives in job.slurm's #SBATCH lines, so the file alone reproduces the job
    # (`extra`, which wins over them, is for `pdbench doctor`'s short check job only).
    return ["sbatch", "--parsable", f"--chdir={run_dir}", *(extra or []), str(RunDir(run_dir).job_script)]


def submit(run_dir: Path, timeout_s: float = 60, extra: list[str] | None = None) -> str:
    if shutil.which("sbatch") is None:
        raise LaunchError("sbatch is not on PATH; use --launcher local to run on this machine")
    out = _run(sbatch_command(run_dir, extra), timeout_s)
    if out.returncode != 0:
        raise LaunchError(f"sbatch failed ({out.returncode}): {out.stderr.strip()}")
    job_id = out.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise LaunchError(f"sbatch answered {out.stdout.strip()!r}, not a job id")
    LaunchRecord.now("slurm", job_id).write(RunDir(run_dir))
    return job_id


def _parse_scontrol(text: str) -> dict[str, str]:
    fields = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def job_info(job_id: str) -> SlurmInfo:
    if shutil.which("sacct"):
        try:
            out = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode,Reason,NodeList"])
        except LauncherSilent:  # slurmdbd busy: slurmctld (scontrol, squeue) may still answer
            out = subprocess.CompletedProcess([], 1, "", "")
        line = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
        if line:
            state, exit_code, reason, nodes = (line.split("|") + [""] * 4)[:4]
            return SlurmInfo(job_id, state.split()[0], exit_code or None, reason or None, nodes or None, "sacct")
    out = _run(["scontrol", "show", "job", "-o", job_id])
    if out.returncode == 0 and out.stdout.strip():
        f = _parse_scontrol(out.stdout)
        return SlurmInfo(
            job_id, f.get("JobState", "UNKNOWN"), f.get("ExitCode"), f.get("Reason"), f.get("NodeList"), "scontrol"
        )
    out = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"])
    if out.returncode == 0 and out.stdout.strip():
        state, reason, nodes = ([*out.stdout.strip().split("|"), "", ""])[:3]
        return SlurmInfo(job_id, state, None, reason or None, nodes or None, "squeue")
    return SlurmInfo(job_id, "UNKNOWN", source="none")


def cancel(job_id: str) -> None:
    out = _run(["scancel", job_id])
    if out.returncode != 0:
        raise LaunchError(f"scancel {job_id} failed: {out.stderr.strip()}")


# Slurm's states in the launchers' common terms. A job whose steps are being torn down
# (COMPLETING) or that is suspended still holds its nodes: running.
STATES = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
}


class SlurmJob(Job):
    launcher = "slurm"

    @property
    def title(self) -> str:
        return f"Slurm job {self.job_id}"

    def info(self) -> JobInfo:
        i = job_info(self.job_id)
        # A state Slurm adds later is still a state of a job Slurm knows: running until it ends.
        state = STATES.get(i.state, JobState.UNKNOWN if i.state == "UNKNOWN" else JobState.RUNNING)
        if i.finished and state is JobState.RUNNING:
            state = JobState.FAILED
        return JobInfo(state, i.state, i.exit_code, i.reason, i.nodes, i.source)

    def cancel(self) -> None:
        cancel(self.job_id)


class SlurmLauncher(Launcher):
    name = "slurm"

    def __init__(self, extra_sbatch: list[str] | None = None):
        self.extra_sbatch = extra_sbatch or []  # wins over job.slurm's #SBATCH lines

    def dry_run(self, run: RunDir, num_nodes: int) -> str:
        return shlex.join(sbatch_command(run.path, self.extra_sbatch))

    def launch(self, run: RunDir, num_nodes: int) -> SlurmJob:
        return SlurmJob(run, submit(run.path, extra=self.extra_sbatch))
