"""`pdbench status`, `logs` and `cancel` of a run, whichever launcher ran its job."""

from __future__ import annotations

from harness.launch.find import NoJob, job_of
from harness.launch.job import LaunchError
from harness.rundir import RunDir, read_status
from harness.submit.refused import Refused


def status_lines(run: RunDir) -> list[str]:
    """The job's state as its launcher reports it, the run's outcome and its result files."""
    lines = [f"run: {run.path}"]
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
    lines += [f"  {r.name}" for r in run.results()]
    return lines


def log_text(run: RunDir, node: int | None, role: str | None, lines: int) -> list[str] | None:
    """The end of each selected log under a `==> name <==` header; None when none matches."""
    files = run.log_files(node, role)
    if not files:
        return None
    out = []
    for f in files:
        text = f.read_text(errors="replace").splitlines()
        out.append(f"==> {run.relative(f)} <==")
        out.append("\n".join(text[-lines:] if lines else text))
    return out


def cancel(run: RunDir) -> str:
    """Cancel the run's job (it was never launched, or has ended: Refused, exit 1)."""
    try:
        job = job_of(run)
        job.cancel()
    except LaunchError as e:
        raise Refused(str(e), code=1) from None
    return f"cancelled {job.title}"
