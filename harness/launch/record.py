"""The launch record (RunDir.launch_record): which launcher ran a run's job, and who it is.

Written once, atomically, when the job starts: by the Slurm launcher after sbatch answers,
by the local launcher before it starts any node, and again with its nodes once they started.
A local job is its launcher process, named by PID and that process's create time, so a later
process that reuses the PID is not it; its nodes are named the same way, so that `cancel`
still finds them when the launcher is gone.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass, replace

from harness import atomic
from harness.launch.job import LaunchError
from harness.rundir import RunDir

LAUNCHERS = ("slurm", "local")


@dataclass(frozen=True)
class LaunchRecord:
    launcher: str  # one of LAUNCHERS
    job_id: str
    host: str  # where the job was launched from (the local launcher: where it runs)
    time: float
    pid: int | None = None  # the local launcher's process
    create_time: float | None = None  # ... and its start, as psutil reports it
    # The local launcher's node processes: each leads its own process group (pid, create_time).
    nodes: tuple[tuple[int, float], ...] = ()

    @classmethod
    def now(cls, launcher: str, job_id: str, pid: int | None = None, create_time: float | None = None) -> LaunchRecord:
        return cls(launcher, job_id, socket.gethostname(), time.time(), pid, create_time)

    def with_nodes(self, nodes: list[tuple[int, float]]) -> LaunchRecord:
        return replace(self, nodes=tuple(nodes))

    def write(self, run: RunDir) -> None:
        atomic.write_json(run.launch_record, asdict(self), indent=2)


def read_record(run: RunDir) -> LaunchRecord | None:
    """The run's launch record; a run launched before there was one has only the Slurm job id
    (read as a Slurm record). None when the run's job was never launched."""
    path = run.launch_record
    if not path.is_file():
        legacy = run.legacy_slurm_job_id
        if legacy.is_file():
            return LaunchRecord("slurm", legacy.read_text().strip(), "", legacy.stat().st_mtime)
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LaunchError(f"{path}: not a readable launch record ({e})") from None
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: a launch record is a JSON object")
    for key in ("launcher", "job_id", "host"):
        if not isinstance(data.get(key), str):
            raise LaunchError(f"{path}: key {key!r} is missing or not a string")
    if not isinstance(data.get("time"), (int, float)):
        raise LaunchError(f"{path}: key 'time' is missing or not a number")
    if data["launcher"] not in LAUNCHERS:
        raise LaunchError(f"{path}: key 'launcher' is {data['launcher']!r}, not one of {', '.join(LAUNCHERS)}")
    local = data["launcher"] == "local"
    if local and not (isinstance(data.get("pid"), int) and isinstance(data.get("create_time"), (int, float))):
        raise LaunchError(f"{path}: a local launch names its launcher by keys 'pid' and 'create_time' (numbers)")
    nodes = data.get("nodes", [])
    if not (
        isinstance(nodes, list)
        and all(
            isinstance(n, list) and len(n) == 2 and isinstance(n[0], int) and isinstance(n[1], (int, float))
            for n in nodes
        )
    ):
        raise LaunchError(f"{path}: key 'nodes' is a list of [pid, create_time] pairs")
    return LaunchRecord(
        data["launcher"],
        data["job_id"],
        data["host"],
        data["time"],
        data.get("pid"),
        data.get("create_time"),
        tuple((n[0], float(n[1])) for n in nodes),
    )
