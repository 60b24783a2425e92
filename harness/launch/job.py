"""One job, whichever launcher ran it (after submitit's Job): its state, a bounded wait, cancel.

A launcher (Slurm, or the local one) starts a run directory's job and records itself in the
run directory (harness.launch.record), so `status`, `logs`, `cancel` and `--wait` find the job
again from any shell. Both launchers answer in the same states; `detail` keeps the launcher's
own word (Slurm's state name), which is what users of that launcher know.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from harness.rundir import RunDir


class LaunchError(RuntimeError):
    pass


class JobState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"  # the launcher no longer knows the job, and the run recorded no outcome

    @property
    def finished(self) -> bool:
        """Nothing of the job runs any more."""
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)


@dataclass(frozen=True)
class JobInfo:
    state: JobState
    detail: str  # the launcher's own name of the state (Slurm's JobState, e.g. COMPLETING)
    exit_code: str | None = None
    reason: str | None = None  # why the job waits or ended, as the launcher says it (Slurm's Reason)
    nodes: str | None = None
    source: str = "none"  # where the answer came from: sacct, scontrol, squeue, process, status
    returncode: int | None = None  # the job's exit status, where the launcher knows it as a number


class Job(ABC):
    launcher: ClassVar[str]  # the name the launch record and `pdbench status` use

    def __init__(self, run: RunDir, job_id: str):
        self.run = run
        self.job_id = job_id

    @property
    @abstractmethod
    def title(self) -> str:
        """The job as a sentence names it: "Slurm job 42"."""

    @abstractmethod
    def info(self) -> JobInfo:
        """The job's state now; raises LaunchError when the launcher cannot be asked."""

    @abstractmethod
    def cancel(self) -> None:
        """Stop the job; every node tears its processes down. Raises LaunchError."""

    def state(self) -> JobState:
        return self.info().state

    def wait(self, timeout_s: float, on_poll: Callable[[JobInfo], None] | None = None, poll_s: float = 2.0) -> JobInfo:
        """Poll until the job ends (or its launcher forgets it); Ctrl-C cancels the job, then re-raises.

        timeout_s counts from when the job leaves the queue: on a busy cluster a job may wait
        for hours, which says nothing about the job. Past it, LaunchError (the job is not
        cancelled). Polls grow sparser the longer it waits (up to 15 s), so that many
        followers do not load the launcher (slurmctld).
        """
        deadline = None
        start = time.monotonic()
        try:
            while True:
                info = self.info()
                if on_poll is not None:
                    on_poll(info)
                if info.state.finished or info.state is JobState.UNKNOWN:
                    return info
                if deadline is None and info.state is not JobState.PENDING:
                    deadline = time.monotonic() + timeout_s
                if deadline is not None and time.monotonic() > deadline:
                    raise LaunchError(
                        f"job {self.job_id} still {info.detail} {timeout_s:.0f} s after it started; not cancelled"
                    )
                time.sleep(min(15.0, poll_s + (time.monotonic() - start) / 60))
        except KeyboardInterrupt:
            self.cancel()
            self._wait_cancelled(120)
            raise

    def _wait_cancelled(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and not self.state().finished:
            time.sleep(1)
