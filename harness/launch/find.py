"""The job of a run directory, from its launch record, whichever launcher ran it."""

from __future__ import annotations

from harness.launch.job import Job, LaunchError
from harness.launch.local import LocalJob
from harness.launch.record import read_record
from harness.launch.slurm import SlurmJob
from harness.rundir import RunDir


class NoJob(LaunchError):
    pass


def job_of(run: RunDir) -> Job:
    """Raises NoJob when the run's job was never launched (a --dry-run, say)."""
    record = read_record(run)
    if record is None:
        raise NoJob(f"{run.path} has no launched job ({run.launch_record.name} is missing)")
    if record.launcher == "local":
        return LocalJob(run, record)
    return SlurmJob(run, record.job_id)
