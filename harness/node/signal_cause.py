"""Why a node runtime was signalled: Slurm's own record of the job, asked with a timeout.

When scancel or the time limit ends a job, every task gets SIGTERM at once and no node
knows why. scontrol does: while the job completes it shows JobState=COMPLETING with
Reason=TimeLimit for an expired limit and Reason=None for scancel (checked on Debian's
slurm-wlm 22.05); a job still RUNNING means the signal came from srun or by hand.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess


def describe_signal(signum: int, timeout_s: float = 3.0) -> str:
    name = signal.Signals(signum).name
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit() or shutil.which("scontrol") is None:
        if os.environ.get("PDBENCH_LAUNCHER") == "local":
            return f"received {name} (the local launcher recorded no reason)"
        return f"received {name} from outside the job"
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        fields = dict(t.partition("=")[::2] for t in out.stdout.split() if "=" in t)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"received {name} from outside the job (Slurm's job state unreadable: {e})"
    state, why = fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None")
    if state == "TIMEOUT" or why == "TimeLimit":
        return f"received {name}: the Slurm job reached its time limit ({fields.get('TimeLimit', '?')})"
    if state == "PREEMPTED":
        return f"received {name}: the Slurm job was preempted"
    if state in ("CANCELLED", "COMPLETING"):
        return f"received {name}: the Slurm job was cancelled (scancel; JobState={state} Reason={why})"
    return f"received {name} from outside the job while it was {state} (Reason={why})"
