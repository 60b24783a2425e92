"""The embedded local launcher: the rendered job on this machine, no Slurm needed.

It does what `srun` does for the job: one process per node running server.sh, each
with the SLURM_* variables a real allocation gives, all on this host (127.0.0.1).
Like `srun --kill-on-bad-exit`, a node that fails ends the others (after they had
the chance to tear down by themselves).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

import psutil

log = logging.getLogger("pdbench.launch")


def node_env(run_dir: Path, job_id: str, node: int, num_nodes: int) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ)
    env.update({
        "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
        "PDBENCH_PYTHON": sys.executable,
        "PDBENCH_NODE_ADDR": "127.0.0.1",
        "RUN_DIR": str(run_dir),
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NAME": f"pdbench-{run_dir.parent.name}",
        "SLURM_JOB_NUM_NODES": str(num_nodes),
        "SLURM_NNODES": str(num_nodes),
        "SLURM_NTASKS": str(num_nodes),
        "SLURM_JOB_NODELIST": f"local[0-{num_nodes - 1}]" if num_nodes > 1 else "local0",
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": f"local{node}",
    })
    return env


class _Tail:
    """Echo new lines of a few log files to the terminal, so a local run shows progress."""

    def __init__(self, paths: list[Path], out: TextIO):
        self.offsets = {p: 0 for p in paths}
        self.out = out

    def pump(self) -> None:
        for path, offset in self.offsets.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue
            cut = data.rfind(b"\n") + 1
            if cut:
                self.out.write(data[:cut].decode(errors="replace"))
                self.out.flush()
                self.offsets[path] = offset + cut


def run_local(run_dir: Path, num_nodes: int, timeout_s: float, grace_s: float,
              echo: TextIO | None = sys.stdout) -> int:
    """Run every node of the job; returns the job's exit status (0 when every node succeeded)."""
    job_id = f"local-{run_dir.name}"
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    nodes: list[subprocess.Popen] = []
    tail = _Tail([logs / "node0.log", logs / "bench.log"], echo) if echo else None
    rc = 0
    try:
        for i in range(num_nodes):
            # The node runtime logs to logs/node<i>.log itself; this keeps anything else it prints.
            with open(logs / f"node{i}.out", "ab") as out:
                nodes.append(subprocess.Popen(
                    ["bash", str(run_dir / "server.sh")], stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, env=node_env(run_dir, job_id, i, num_nodes),
                    cwd=run_dir, start_new_session=True))
        log.info("local job %s: %d node process(es), pids %s", job_id, num_nodes, [p.pid for p in nodes])
        deadline = time.monotonic() + timeout_s
        first_failure_at: float | None = None
        while any(p.poll() is None for p in nodes):
            if tail:
                tail.pump()
            codes = [p.poll() for p in nodes]
            if first_failure_at is None and any(c not in (None, 0) for c in codes):
                first_failure_at = time.monotonic()
            if first_failure_at is not None and time.monotonic() - first_failure_at > grace_s + 30:
                log.error("a node failed; stopping the others")
                break
            if time.monotonic() > deadline:
                log.error("the job exceeded its time limit of %.0f s; stopping it", timeout_s)
                rc = 124
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        log.error("interrupted; stopping every node")
        rc = 130
    finally:
        _stop(nodes, grace_s + 30)
        _sweep_leftovers(run_dir)
        if tail:
            tail.pump()
    if rc == 0:
        rc = next((c for c in (p.returncode for p in nodes) if c), 0)
    return rc


def _stop(nodes: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM lets each node runtime tear down its own processes; SIGKILL after grace."""
    for p in nodes:
        if p.poll() is None:
            _killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in nodes:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def _sweep_leftovers(run_dir: Path) -> None:
    """Kill what a node runtime recorded but could not reap (it was SIGKILLed, say)."""
    for record in (run_dir / "state").glob("procs-node*.json"):
        try:
            procs = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        for entry in procs:
            try:
                p = psutil.Process(entry["pid"])
                if abs(p.create_time() - entry["create_time"]) > 1:
                    continue  # the PID was reused by something else
            except psutil.NoSuchProcess:
                continue
            log.warning("killing leftover %s (pid %d)", entry["name"], entry["pid"])
            victims = [p] + p.children(recursive=True)
            _killpg(entry["pid"], signal.SIGKILL)
            for v in victims:
                try:
                    v.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(victims, timeout=5)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
