"""`pdbench status` without a run: the recent runs, one line each (like squeue), or JSON.

A run's state comes from what it recorded (status.json, the failure records) where it has
ended, and from its launcher only while it may still run, so listing many ended runs asks
Slurm nothing.
"""

from __future__ import annotations

import calendar
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.launch.find import job_of
from harness.launch.job import JobState, LaunchError
from harness.launch.local import CANCELLED
from harness.launch.record import read_record
from harness.rundir import RunDir, read_status
from harness.submit.points import PointsUnknown, planned

NOT_SUBMITTED = "not submitted"


@dataclass(frozen=True)
class RunRow:
    recipe: str
    short_id: str
    run_id: str
    path: str
    launcher: str | None  # slurm, local; None when never submitted
    job_id: str | None
    state: str  # pending, running, succeeded, failed, timeout, cancelled, unknown, not submitted
    reason: str | None
    submitted_at: float | None  # epoch s, from the launch record
    finished_at: float | None
    duration_s: float | None  # submitted to finished (or to now while it runs)
    points_valid: int | None
    points_total: int | None  # None: the run's client config is unreadable


def _not_submitted_reason(run: RunDir) -> str:
    try:
        return str(json.loads(run.not_submitted.read_text())["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return "why is not recorded"


def run_state(run: RunDir) -> tuple[str, str | None]:
    """(state, reason): what the run recorded once it ended, else what its launcher says now."""
    if run.never_submitted:
        return NOT_SUBMITTED, _not_submitted_reason(run)
    status = read_status(run)
    if status is not None and status.get("finished_at") is not None:
        cancelled = (status.get("failure") or {}).get("cause") == CANCELLED
        return ("cancelled" if cancelled else str(status["state"])), status.get("reason")
    try:
        info = job_of(run).info()
    except LaunchError as e:
        return "unknown", str(e)
    if info.state is JobState.UNKNOWN and status is not None:  # the head node died before status.json
        return str(status["state"]), status.get("reason")
    if info.state is JobState.COMPLETED:  # ended, but its head node wrote no outcome
        return "unknown", f"the {job_of(run).launcher} job completed, but the run recorded no outcome"
    return info.state.value, info.reason if info.reason not in (None, "None") else None


def run_row(run: RunDir, now: float | None = None) -> RunRow:
    record = None
    if run.launched:
        try:
            record = read_record(run)
        except LaunchError:
            record = None
    state, reason = run_state(run)
    status = read_status(run)
    finished = status.get("finished_at") if status else None
    start = record.time if record else None
    end = finished if finished is not None else (now or time.time()) if state in ("running", "pending") else None
    try:
        points = planned(run)
        valid, total = sum(p.valid for p in points), len(points)
    except PointsUnknown:
        valid, total = None, None
    return RunRow(
        recipe=run.recipe,
        short_id=run.short_id,
        run_id=run.run_id,
        path=str(run.path),
        launcher=record.launcher if record else None,
        job_id=record.job_id if record else None,
        state=state,
        reason=reason,
        submitted_at=start,
        finished_at=finished,
        duration_s=round(end - start, 1) if start is not None and end is not None and state != "pending" else None,
        points_valid=valid,
        points_total=total,
    )


def recent_runs(results_dir: Path, limit: int) -> tuple[list[RunRow], int]:
    """The newest LIMIT runs under RESULTS_DIR (0: all) and how many there are in all."""
    runs = RunDir.all_runs(results_dir)
    now = time.time()
    return [run_row(r, now) for r in (runs[:limit] if limit else runs)], len(runs)


def _count(n: int | None) -> str:
    return "?" if n is None else str(n)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}:{s % 60:02d}"
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _created(row: RunRow) -> str:
    """When the run directory was made (its id's UTC timestamp), in local time."""
    try:
        stamp = calendar.timegm(time.strptime(row.run_id.partition("-")[0], "%Y%m%dT%H%M%SZ"))
    except ValueError:
        return "-"
    return time.strftime("%m-%d %H:%M", time.localtime(stamp))


HEADER = ("ID", "RECIPE", "LAUNCHER", "STATE", "CREATED", "TIME", "POINTS")


def table(rows: list[RunRow], width: int | None = None) -> list[str]:
    """squeue-like lines, newest first; the recipe column gives way so a line fits WIDTH (a terminal's)."""
    cells = [
        (
            r.short_id,
            r.recipe,
            r.launcher or "-",
            r.state,
            _created(r),
            _duration(r.duration_s),
            f"{_count(r.points_valid)}/{_count(r.points_total)}",
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADER)]
    if width is not None:
        room = width - (sum(widths) - widths[1]) - 2 * (len(HEADER) - 1)
        widths[1] = max(len(HEADER[1]), min(widths[1], room))

    def line(c: tuple[str, ...]) -> str:
        recipe = c[1] if len(c[1]) <= widths[1] else c[1][: widths[1] - 1] + "~"
        left = [v.ljust(w) for v, w in zip((c[0], recipe, *c[2:-1]), widths[:-1], strict=True)]
        return "  ".join([*left, c[-1].rjust(widths[-1])])

    return [line(HEADER), *(line(c) for c in cells)]


def status_listing(results_dir: Path, limit: int, as_json: bool, width: int | None = None) -> list[str]:
    """What `pdbench status` prints without a run: WIDTH is the terminal's (None: not a terminal)."""
    rows, count = recent_runs(results_dir, limit)
    if as_json:
        return [json.dumps([asdict(r) for r in rows], indent=2)]
    if not rows:
        return [f"no runs under {results_dir}"]
    out = table(rows, width)
    if count > len(rows):
        out.append(f"({len(rows)} newest of {count} runs; --limit 0 for all)")
    return out


def status_json(run: RunDir) -> str:
    """`pdbench status RUN --json`: the run's line of the listing, as one JSON object."""
    return json.dumps(asdict(run_row(run)), indent=2)
