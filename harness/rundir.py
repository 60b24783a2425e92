"""Run directories: results/<recipe>/<UTC timestamp>-<short id>/, created once, never reused."""

from __future__ import annotations

import secrets
import time
from pathlib import Path


def create_run_dir(results_root: Path, recipe_name: str) -> Path:
    parent = results_root / recipe_name
    parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = parent / f"{stamp}-{secrets.token_hex(3)}"
        try:
            path.mkdir()  # exist_ok=False: a run directory is never reused
        except FileExistsError:
            continue
        (path / "logs").mkdir()
        return path
    raise RuntimeError(f"could not create a new run directory under {parent}")


# What each server and node of a job ran, recorded under STATE_DIR for every result's metadata
# (harness.node.versions and the rendered job scripts write them; harness.bench.runtime_info
# reads them). One file per writer, so no two writers share a file.
STATE_DIR = "state"
IMAGE_RECORD_GLOB = "image-*.json"
IMAGE_RECORD_JOB = "image-job.json"  # one image file for the whole job (enroot, apptainer)


def server_record_name(server: str) -> str:
    """A server's interpreter and package versions, written by its node."""
    return f"runtime-{server}.json"


def image_record_name(node: int | str) -> str:
    """The image one node ran (docker, podman); `node` may be a shell word such as "$NODE"."""
    return f"image-node{node}.json"


# The cause a node records when Slurm's warning before the time limit (sbatch --signal=USR2)
# stops the job: `pdbench node` and container.sh write it, status readers call such a job "timeout".
TIME_LIMIT_WARNING = (
    "Slurm warned that the job's time limit is near (sbatch --signal=USR2): the sweep was stopped "
    "before it; the points finished so far are kept"
)
