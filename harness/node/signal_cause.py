"""Why a node runtime was signalled: Slurm's own record of the job, asked with a timeout.

When scancel or the time limit ends a job, every task gets SIGTERM at once and no node
knows why. scontrol does: while the job completes it shows JobState=COMPLETING with
Reason=TimeLimit for an expired limit and Reason=None for scancel (checked on Debian's
slurm-wlm 22.05); a job still RUNNING means the signal came from srun or by hand. Inside a container there
is no scontrol: the host-side wrapper records its answer in a file for the node to read.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path


def _scontrol_job(job_id: str, timeout_s: float) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    return out.stdout


def _recorded_job(path: Path, timeout_s: float) -> str:
    """Inside a container (no scontrol): the line container.sh on the host wrote from
    `scontrol -o show job` when the same signal reached it."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the host recorded no job state in {path} within {timeout_s:.0f} s")
        time.sleep(0.1)
    return path.read_text()


def describe_signal(signum: int, timeout_s: float = 3.0) -> str:
    name = signal.Signals(signum).name
    job_id = os.environ.get("SLURM_JOB_ID", "")
    record = os.environ.get("PDBENCH_SLURM_JOB_RECORD")
    if not job_id.isdigit() or (shutil.which("scontrol") is None and not record):
        if os.environ.get("PDBENCH_LAUNCHER") == "local":
            return f"received {name} (the local launcher recorded no reason)"
        return f"received {name} from outside the job"
    try:
        if shutil.which("scontrol") or record is None:
            text = _scontrol_job(job_id, timeout_s)
        else:
            text = _recorded_job(Path(record), timeout_s)
        fields = dict(t.partition("=")[::2] for t in text.split() if "=" in t)
    except (OSError, subprocess.TimeoutExpired, TimeoutError) as e:
        return f"received {name} from outside the job (Slurm's job state unreadable: {e})"
    state, why = fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None")
    if state == "TIMEOUT" or why == "TimeLimit":
        return f"received {name}: the Slurm job reached its time limit ({fields.get('TimeLimit', '?')})"
    if state == "PREEMPTED":
        return f"received {name}: the Slurm job was preempted"
    if state in ("CANCELLED", "COMPLETING"):
        return f"received {name}: the Slurm job was cancelled (scancel; JobState={state} Reason={why})"
    return f"received {name} from outside the job while it was {state} (Reason={why})"
