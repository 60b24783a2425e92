"""Show a launched job to its end: state changes, the benchmark's progress, then the outcome."""

from __future__ import annotations

import shlex
import sys
import time

from harness import exit_codes
from harness.config.load import PROJECT_ROOT
from harness.invocation import prog
from harness.launch.health_wait import HealthWait
from harness.launch.job import Job, JobInfo, JobState, LaunchError
from harness.launch.log_tail import LogTail
from harness.rundir import RunDir, read_status
from harness.submit.points import Point, PointsUnknown, other_client_sweeps, planned

# The job's own time limit plus this much: teardown and the launcher's polling.
FOLLOW_SLACK_S = 600
# On NFS another host's new file can take a few seconds (attribute caching) to appear here.
STATUS_SETTLE_S = 10


def say(message: str) -> None:
    print(message, flush=True)


def run_ref(run: RunDir) -> str:
    """How the other commands name RUN: recipe/short id, with --results-dir where it is not the default."""
    ref = f"{run.recipe}/{run.short_id}"
    root = run.path.parent.parent
    if root.resolve() != (PROJECT_ROOT / "results").resolve():
        ref += f" --results-dir {shlex.quote(str(root))}"
    return ref


def point_table(points: list[Point]) -> list[str]:
    """One line per point: median TTFT and TPOT, output throughput, and whether it is valid."""
    width = max([len("point"), *(len(p.label) for p in points)])
    lines = [f"  {'point':<{width}}  {'TTFT ms':>8}  {'TPOT ms':>8}  {'out tok/s':>10}  valid"]
    for p in points:
        r = p.result
        if r is None:
            lines.append(f"  {p.label:<{width}}  {'-':>8}  {'-':>8}  {'-':>10}  {p.verdict}")
            continue
        tpot = getattr(r, "median_tpot_ms", None)  # absent when every request had one token
        tpot_text = f"{tpot:.2f}" if isinstance(tpot, (int, float)) else "-"
        ttft = "n/a" if r.median_ttft_ms is None else f"{r.median_ttft_ms:.1f}"  # no request completed
        lines.append(f"  {p.label:<{width}}  {ttft:>8}  {tpot_text:>8}  {r.output_throughput:>10.1f}  {p.verdict}")
    return lines


def resume_command(run: RunDir) -> str | None:
    """This `submit` command line again, resuming RUN (its finished points kept, the others
    measured); None when this process is not a `submit`."""
    argv = sys.argv[1:]
    if argv[:1] != ["submit"]:
        return None
    args: list[str] = []
    skip = False
    for a in argv:
        if skip or a.startswith("--resume="):
            skip = False
            continue
        if a == "--resume":
            skip = True
            continue
        args.append(a)
    return f"{prog()} {shlex.join(args)} --resume {shlex.quote(str(run.path))}"


def summary(run: RunDir, rc: int) -> None:
    """The run's outcome, a line per point, and the commands to read it further (or to resume it).
    A sweep another client measured has no pdbench points: its line says where that client's are."""
    outcome = "succeeded" if rc == 0 else f"FAILED (exit {rc})"
    try:
        points, others = planned(run), other_client_sweeps(run)
    except PointsUnknown as e:
        points, others = [], []
        say(f"note: {e}")
    written = any(p.result is not None for p in points) or any(o.written for o in others)
    if others and not points:
        say(f"\n{outcome}: {others[0].line}")
        others = others[1:]
    else:
        say(f"\n{outcome}: {sum(p.valid for p in points)} of {len(points)} point(s) valid, in {run.path}")
    for line in [*(point_table(points) if points else []), *(f"  {o.line}" for o in others)]:
        say(line)
    _next_steps(run, rc, points_written=written)
    if rc != 0 and not all(p.valid for p in points) and (command := resume_command(run)) is not None:
        say(f"resume: {command}")


def _next_steps(run: RunDir, rc: int, points_written: bool) -> None:
    status = read_status(run)
    if rc != 0 and status and status.get("reason"):
        say(f"reason: {status['reason']}")
    ref = run_ref(run)
    if points_written:
        say(f"next: {prog()} report {ref}")
    if rc != 0:
        say(f"logs: {prog()} logs {ref}")


def follow(job: Job, timeout_s: float) -> int:
    """Until the job ends; Ctrl-C cancels it. 0 when the run succeeded, 130 when interrupted, else 1."""
    tail = LogTail.progress(job.run, sys.stdout)
    health = HealthWait(job.run, sys.stdout)
    seen: list[str] = []

    def on_poll(info: JobInfo) -> None:
        if info.detail not in seen:
            reason = f" ({info.reason})" if info.reason not in (None, "None") else ""
            say(f"job {job.job_id}: {info.detail}{reason}")
            seen.append(info.detail)
        tail.pump()
        if info.state is JobState.RUNNING:
            health.pump()

    try:
        info = job.wait(timeout_s + FOLLOW_SLACK_S, on_poll)
    except KeyboardInterrupt:
        print(f"\ninterrupted: cancelled {job.title}", file=sys.stderr, flush=True)
        if (command := resume_command(job.run)) is not None:
            say(f"resume: {command}")
        return exit_codes.INTERRUPTED
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
