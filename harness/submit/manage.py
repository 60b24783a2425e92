"""`pdbench status`, `logs` and `cancel` of a run, whichever launcher ran its job."""

from __future__ import annotations

from pathlib import Path

from harness.invocation import prog
from harness.launch.find import NoJob, job_of
from harness.launch.job import LaunchError
from harness.rundir import RunDir, read_status
from harness.submit.follow import point_table, run_ref
from harness.submit.points import PointsUnknown, other_client_sweeps, planned
from harness.submit.refused import Refused
from harness.submit.runs import run_state


def status_lines(run: RunDir) -> list[str]:
    """The job's state as its launcher reports it, the run's outcome and its points."""
    lines = [f"run: {run.path}"]
    if run.never_submitted:
        _, reason = run_state(run)
        return [*lines, f"never submitted: {reason}; nothing ran, so it has no job, logs or results"]
    try:
        job = job_of(run)
    except NoJob:
        job = None
    except LaunchError as e:
        lines.append(f"job: state unavailable ({e})")
        job = None
    if job is not None:
        try:
            info = job.info()
            lines.append(
                f"{job.launcher} job {job.job_id}: {info.detail} "
                f"(exit {info.exit_code}, nodes {info.nodes}, via {info.source})"
            )
        except LaunchError as e:
            lines.append(f"{job.launcher} job {job.job_id}: state unavailable ({e})")
    st = read_status(run)
    lines.append(f"outcome: {st['state'] if st else f'not finished (no {run.status.name} yet)'}")
    if st and st.get("reason"):
        lines.append(f"reason: {st['reason']}")
    try:
        points, others = planned(run), other_client_sweeps(run)
    except PointsUnknown as e:
        return [*lines, f"points: unknown ({e})", *(f"  {r.name}" for r in run.results())]
    lines.append(f"points: {sum(p.valid for p in points)} of {len(points)} valid")
    lines += point_table(points)
    lines += [f"  {o.line}" for o in others]  # a sweep another client measured: its points, not pdbench's
    if any(p.result is not None for p in points) or any(o.written for o in others):
        lines.append(f"next: {prog()} report {run_ref(run)}")
    return lines


def log_text(run: RunDir, node: int | None, role: str | None, lines: int) -> list[str] | None:
    """The end of each selected log under a `==> name <==` header; None when none matches."""
    files = run.log_files(node, role)
    if not files:
        return None
    return _blocks(run, files, lines)


def log_blocks(run: RunDir, node: int | None, role: str | None, lines: int) -> list[str]:
    """The end of each selected log under a `==> name <==` header; Refused (exit 1) saying why there is none."""
    if run.never_submitted:
        _, reason = run_state(run)
        raise Refused(f"{run.path}: never submitted ({reason}): it has no logs", code=1)
    files = run.log_files(node, role)
    if not files:
        which = [w for w in (f"node {node}" if node is not None else "", f"role {role}" if role else "") if w]
        if which:
            raise Refused(f"{run.path}: no log of {' and '.join(which)}", code=1)
        raise Refused(f"{run.path}: no logs yet (its job has not started)", code=1)
    return _blocks(run, files, lines)


def _blocks(run: RunDir, files: list[Path], lines: int) -> list[str]:
    out = []
    for f in files:
        text = f.read_text(errors="replace").splitlines()
        out.append(f"==> {run.relative(f)} <==")
        out.append("\n".join(text[-lines:] if lines else text))
    return out


def cancel(run: RunDir) -> str:
    """Cancel the run's job (it was never launched, or has ended: Refused, exit 1)."""
    if run.never_submitted:
        _, reason = run_state(run)
        raise Refused(f"{run.path}: never submitted ({reason}): nothing to cancel", code=1)
    try:
        job = job_of(run)
        job.cancel()
    except LaunchError as e:
        raise Refused(str(e), code=1) from None
    return f"cancelled {job.title}"
