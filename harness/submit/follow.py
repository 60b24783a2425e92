"""Show a launched job to its end: state changes, the benchmark's progress, then the outcome."""

from __future__ import annotations

import sys
import time

from harness.launch.job import Job, JobInfo, JobState, LaunchError
from harness.launch.log_tail import LogTail
from harness.rundir import RunDir, read_status

# The job's own time limit plus this much: teardown and the launcher's polling.
FOLLOW_SLACK_S = 600
# On NFS another host's new file can take a few seconds (attribute caching) to appear here.
STATUS_SETTLE_S = 10


def say(message: str) -> None:
    print(message, flush=True)


def summary(run: RunDir, rc: int) -> None:
    results = run.results()
    say(f"\n{'succeeded' if rc == 0 else f'FAILED (exit {rc})'}: {len(results)} result file(s) in {run.path}")
    for r in results:
        say(f"  {r.name}")
    status = read_status(run)
    if rc != 0 and status and status.get("reason"):
        say(f"reason: {status['reason']}")


def follow(job: Job, timeout_s: float) -> int:
    """Until the job ends; Ctrl-C cancels it. 0 when the run succeeded, 130 when interrupted, else 1."""
    tail = LogTail.progress(job.run, sys.stdout)
    seen: list[str] = []

    def on_poll(info: JobInfo) -> None:
        if info.detail not in seen:
            reason = f" ({info.reason})" if info.reason not in (None, "None") else ""
            say(f"job {job.job_id}: {info.detail}{reason}")
            seen.append(info.detail)
        tail.pump()

    try:
        info = job.wait(timeout_s + FOLLOW_SLACK_S, on_poll)
    except KeyboardInterrupt:
        print(f"\ninterrupted: cancelled {job.title}", file=sys.stderr, flush=True)
        return 130
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    # The run's status.json is the authority on success; the launcher's state covers what it cannot see.
    status = read_status(job.run)
    settle = time.monotonic() + STATUS_SETTLE_S
    while (status is None or status.get("finished_at") is None) and time.monotonic() < settle:
        time.sleep(1)
        status = read_status(job.run)
    tail.pump()
    ok = info.state is JobState.COMPLETED and status is not None and status["state"] == "succeeded"
    if info.state is JobState.UNKNOWN and status is not None:
        ok = status["state"] == "succeeded"
    rc = 0 if ok else 1
    say(f"job {job.job_id} ended: {info.detail}")
    summary(job.run, rc)
    return rc
