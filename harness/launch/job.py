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

from harness.rundir import RunDir, read_status

# A job's nodes record its end in status.json before its launcher says so (Slurm's teardown and
# state follow): from then on a follower asks the launcher every END_POLL_S, for at most
# END_WAIT_S (past that, a launcher slow to say so is asked at the usual interval again).
END_POLL_S = 1.0
END_WAIT_S = 30.0


def recorded_end(run: RunDir) -> bool:
    """Whether the run's nodes recorded its end (status.json's finished_at)."""
    return (read_status(run) or {}).get("finished_at") is not None


def nap(seconds: float, ending: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> None:
    """Sleep until a follower's next poll: `seconds`, or END_POLL_S since the nap began once
    ending() says a job it follows recorded its end; ending() is asked every END_POLL_S."""
    start = time.monotonic()
    end = start + seconds
    while True:
        if ending():
            end = min(end, start + END_POLL_S)
        left = end - time.monotonic()
        if left <= 0:
            return
        sleep(min(END_POLL_S, left))


class LaunchError(RuntimeError):
    pass


class LauncherSilent(LaunchError):
    """The launcher did not answer in time (a busy slurmctld or slurmdbd): the job's state is
    not known now, which says nothing about the job."""


# How long a follower keeps asking a launcher that does not answer before it gives up on it.
SILENT_S = 300.0


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

    def wait(
        self,
        timeout_s: float,
        on_poll: Callable[[JobInfo], None] | None = None,
        poll_s: float = 2.0,
        silent_s: float = SILENT_S,
    ) -> JobInfo:
        """Poll until the job ends (or its launcher forgets it); Ctrl-C cancels the job, then re-raises.

        timeout_s counts from when the job leaves the queue: on a busy cluster a job may wait
        for hours, which says nothing about the job. Past it, LaunchError (the job is not
        cancelled). Polls grow sparser the longer it waits (up to 15 s), so that many
        followers do not load the launcher (slurmctld); once the run records its end they come
        every END_POLL_S (nap), so the caller does not wait out a long interval for nothing.
        A launcher that does not answer (LauncherSilent) is asked again at the next poll, for up
        to `silent_s` in a row; then LaunchError.
        """
        deadline = None
        start = time.monotonic()
        silent_since: float | None = None
        seen_end: list[float] = []  # when the run was first seen to record its end

        def ending() -> bool:
            if not seen_end and recorded_end(self.run):
                seen_end.append(time.monotonic())
            return bool(seen_end) and time.monotonic() - seen_end[0] < END_WAIT_S

        try:
            while True:
                try:
                    info = self.info()
                except LauncherSilent as e:
                    silent_since = silent_since or time.monotonic()
                    if time.monotonic() - silent_since > silent_s:
                        raise LaunchError(f"{e}, and no answer for {silent_s:.0f} s since") from None
                    nap(min(15.0, poll_s + (time.monotonic() - start) / 60), ending)
                    continue
                silent_since = None
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
                nap(min(15.0, poll_s + (time.monotonic() - start) / 60), ending)
        except KeyboardInterrupt:
            self.cancel()
            self._wait_cancelled(120)
            raise

    def _wait_cancelled(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and not self.state().finished:
            time.sleep(1)
