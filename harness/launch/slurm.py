"""Submit a rendered job to Slurm, follow it, cancel it.

Job state comes from sacct when accounting is on, else from scontrol (and squeue), as
on clusters (and CI clusters) that run without slurmdbd. Every call has a timeout.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


class SubmitError(RuntimeError):
    pass


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # Slurm's state name, or UNKNOWN when Slurm no longer knows the job
    exit_code: str | None = None
    reason: str | None = None
    nodes: str | None = None
    source: str = "scontrol"

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{shlex.join(cmd)} did not answer within {timeout:.0f} s") from None
    except FileNotFoundError:
        raise SubmitError(f"{cmd[0]} is not on PATH") from None


def sbatch_command(run_dir: Path, extra: list[str] | None = None) -> list[str]:
    # Every option lives in job.slurm's #SBATCH lines, so the file alone reproduces the job
    # (`extra`, which wins over them, is for `pdbench doctor`'s short check job only).
    return ["sbatch", "--parsable", f"--chdir={run_dir}", *(extra or []), str(run_dir / "job.slurm")]


def submit(run_dir: Path, timeout_s: float = 60, extra: list[str] | None = None) -> str:
    if shutil.which("sbatch") is None:
        raise SubmitError("sbatch is not on PATH; use --launcher local to run on this machine")
    out = _run(sbatch_command(run_dir, extra), timeout_s)
    if out.returncode != 0:
        raise SubmitError(f"sbatch failed ({out.returncode}): {out.stderr.strip()}")
    job_id = out.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SubmitError(f"sbatch answered {out.stdout.strip()!r}, not a job id")
    (run_dir / "slurm_job_id").write_text(job_id + "\n")
    return job_id


def job_id_of(run_dir: Path) -> str | None:
    p = run_dir / "slurm_job_id"
    return p.read_text().strip() if p.is_file() else None


def _parse_scontrol(text: str) -> dict[str, str]:
    fields = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def job_info(job_id: str) -> JobInfo:
    if shutil.which("sacct"):
        out = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode,Reason,NodeList"])
        line = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
        if line:
            state, exit_code, reason, nodes = (line.split("|") + [""] * 4)[:4]
            return JobInfo(job_id, state.split()[0], exit_code or None, reason or None, nodes or None, "sacct")
    out = _run(["scontrol", "show", "job", "-o", job_id])
    if out.returncode == 0 and out.stdout.strip():
        f = _parse_scontrol(out.stdout)
        return JobInfo(
            job_id, f.get("JobState", "UNKNOWN"), f.get("ExitCode"), f.get("Reason"), f.get("NodeList"), "scontrol"
        )
    out = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"])
    if out.returncode == 0 and out.stdout.strip():
        state, reason, nodes = ([*out.stdout.strip().split("|"), "", ""])[:3]
        return JobInfo(job_id, state, None, reason or None, nodes or None, "squeue")
    return JobInfo(job_id, "UNKNOWN", source="none")


def cancel(job_id: str) -> None:
    out = _run(["scancel", job_id])
    if out.returncode != 0:
        raise SubmitError(f"scancel {job_id} failed: {out.stderr.strip()}")


def wait(job_id: str, timeout_s: float, on_poll: Callable[[JobInfo], None], poll_s: float = 2.0) -> JobInfo:
    """Poll until the job ends (or Slurm forgets it); Ctrl-C cancels the job, then re-raises.

    timeout_s counts from when the job leaves the queue: on a busy cluster a job may wait
    for hours, which says nothing about the job. Polls grow sparser the longer it waits
    (up to 15 s), so that many followers do not load slurmctld.
    """
    deadline = None
    start = time.monotonic()
    try:
        while True:
            info = job_info(job_id)
            on_poll(info)
            if info.finished or info.state == "UNKNOWN":
                return info
            if deadline is None and info.state not in ("PENDING", "REQUEUED", "CONFIGURING"):
                deadline = time.monotonic() + timeout_s
            if deadline is not None and time.monotonic() > deadline:
                raise SubmitError(f"job {job_id} still {info.state} {timeout_s:.0f} s after it started; not cancelled")
            time.sleep(min(15.0, poll_s + (time.monotonic() - start) / 60))
    except KeyboardInterrupt:
        cancel(job_id)
        end = time.monotonic() + 120
        while time.monotonic() < end and not job_info(job_id).finished:
            time.sleep(1)
        raise
