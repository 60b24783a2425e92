"""Floor 4: launchers (Slurm, local) start a rendered run directory's job, and find it again.

A launcher (launcher.py) starts the nodes as processes (sbatch, or server.sh here) and records
itself in the run directory (record.py); job_of (find.py) reads that record back into a Job
(job.py) whose state, wait and cancel are the same for both. Nothing here imports harness.node.
"""
