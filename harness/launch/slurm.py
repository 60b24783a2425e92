"""Submit a rendered job to Slurm with sbatch."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path


class SubmitError(RuntimeError):
    pass


def sbatch_command(run_dir: Path) -> list[str]:
    # Every option lives in job.slurm's #SBATCH lines, so the file alone reproduces the job.
    return ["sbatch", "--parsable", f"--chdir={run_dir}", str(run_dir / "job.slurm")]


def submit(run_dir: Path, timeout_s: float = 60) -> str:
    cmd = sbatch_command(run_dir)
    if shutil.which("sbatch") is None:
        raise SubmitError("sbatch is not on PATH; use --launcher local to run on this machine")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"sbatch did not answer within {timeout_s:.0f} s: {shlex.join(cmd)}") from None
    if out.returncode != 0:
        raise SubmitError(f"sbatch failed ({out.returncode}): {out.stderr.strip()}")
    job_id = out.stdout.strip().split(";")[0]
    (run_dir / "slurm_job_id").write_text(job_id + "\n")
    return job_id
