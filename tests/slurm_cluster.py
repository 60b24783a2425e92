"""Helpers for tests that run against the real local Slurm cluster of scripts/slurm/up.sh.

    from slurm_cluster import require_cluster, sbatch, wait_job, processes_in_node_namespaces

    def test_three_nodes(tmp_path):
        require_cluster(3)                       # skip (or fail with PDBENCH_REQUIRE_SLURM=1)
        job = sbatch("-N3", "--wrap", "srun -N3 -n3 hostname", cwd=tmp_path)
        assert wait_job(job, 60) == "COMPLETED"
        assert not any(processes_in_node_namespaces().values())

Accounting is disabled on that cluster, so job states come from `scontrol show job`; a
finished job stays visible there for MinJobAge (300 s).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness.launch.slurm import TERMINAL

ROOT = Path(__file__).resolve().parents[1]
UP = ROOT / "scripts" / "slurm" / "up.sh"
DOWN = ROOT / "scripts" / "slurm" / "down.sh"
CONTAINERS_UP = ROOT / "scripts" / "slurm" / "containers-up.sh"
IMAGE_BUILD = ROOT / "scripts" / "image" / "build.sh"
DOCKER_SOCKETS = Path("/run/pdbench-docker")
#: What runs on every node besides a job: Slurm's daemon and the node's container runtime.
NODE_DAEMONS = frozenset({"slurmd", "dockerd", "containerd"})

#: Why the last ensure_cluster() returned False ("" after a success).
last_reason = ""

#: The launcher's terminal job states, and the job no longer known to Slurm at all.
TERMINAL_STATES = TERMINAL | {"NOT_FOUND"}


def _can_be_root() -> bool:
    if os.geteuid() == 0:
        return True
    if shutil.which("sudo") is None:
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


def ensure_cluster(nodes: int = 3, timeout: float = 600) -> bool:
    """Bring the cluster up with `nodes` nodes (a no-op when it already is). Returns False,
    with the reason in `last_reason`, where that is not possible here."""
    global last_reason
    last_reason = ""
    if not sys.platform.startswith("linux"):
        last_reason = "a local Slurm cluster needs Linux"
    elif not _can_be_root():
        last_reason = "scripts/slurm/up.sh needs root (or passwordless sudo)"
    elif not UP.is_file():
        last_reason = f"{UP} is missing"
    if last_reason:
        return False
    env = dict(os.environ, PDBENCH_SLURM_NODES=str(nodes))
    try:
        r = subprocess.run(["bash", str(UP)], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        last_reason = f"scripts/slurm/up.sh did not finish within {timeout:.0f} s"
        return False
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        last_reason = f"scripts/slurm/up.sh exited {r.returncode}:\n{tail}"
        return False
    return True


_image: str | None = None


def ensure_containers(timeout: float = 1800) -> str:
    """The CI image (scripts/image/build.sh, cached) on podman and on every node's own
    dockerd (scripts/slurm/containers-up.sh); returns its tag. Once per test session."""
    global _image
    if _image is None:
        r = subprocess.run(["bash", str(IMAGE_BUILD)], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"scripts/image/build.sh exited {r.returncode}:\n{r.stderr[-3000:]}")
        tag, tarball = r.stdout.split()
        r = subprocess.run(["bash", str(CONTAINERS_UP), tag, tarball], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"scripts/slurm/containers-up.sh exited {r.returncode}:\n{r.stderr[-3000:]}")
        _image = tag
    return _image


def _listening(sock: Path) -> bool:
    """Whether a daemon accepts connections on the unix socket SOCK."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(str(sock))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
    return True


def pdbench_containers() -> dict[str, list[str]]:
    """{where: [container, ...]} of every pdbench container (running or not) on each node's
    dockerd and on podman: after a job, all lists must be empty."""
    out: dict[str, list[str]] = {}
    fmt = "{{.Names}} {{.Status}}"
    for sock in sorted(DOCKER_SOCKETS.glob("node*.sock")):
        if not _listening(sock):
            continue  # left by a dockerd that was killed, not stopped: no daemon, no containers
        argv = ["docker", "-H", f"unix://{sock}", "ps", "-a", "--filter", "label=pdbench.job", "--format", fmt]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
        out[f"docker@{sock.stem}"] = r.stdout.splitlines()
    if shutil.which("podman"):
        argv = ["podman", "ps", "-a", "--filter", "label=pdbench.job", "--format", fmt]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        out["podman"] = r.stdout.splitlines()
    return out


def require_cluster(nodes: int = 3) -> None:
    """ensure_cluster() or skip the test; with PDBENCH_REQUIRE_SLURM set, fail instead."""
    import pytest

    if not ensure_cluster(nodes):
        if os.environ.get("PDBENCH_REQUIRE_SLURM"):
            pytest.fail(f"no local Slurm cluster: {last_reason}")
        pytest.skip(f"no local Slurm cluster: {last_reason}")


def sbatch(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 60) -> str:
    """`sbatch --parsable ARGS...`; returns the job id."""
    r = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"sbatch {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout.strip().split(";")[0]


def job_state(job_id: str | int) -> str:
    """JobState from `scontrol show job`, e.g. PENDING, RUNNING, COMPLETING, COMPLETED;
    NOT_FOUND when slurmctld no longer (or never) knew the job."""
    r = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True, timeout=30)
    m = re.search(r"\bJobState=(\S+)", r.stdout)
    if m:
        return m.group(1)
    if "Invalid job id" in r.stderr:
        return "NOT_FOUND"
    raise RuntimeError(f"scontrol show job {job_id} failed ({r.returncode}): {r.stderr.strip()}")


def wait_job(job_id: str | int, timeout: float, poll: float = 0.5) -> str:
    """Wait until the job reaches a terminal state and return it; after `timeout` seconds
    return the state it is in then (e.g. RUNNING), so `assert wait_job(j, 60) == "COMPLETED"`
    reads well when it fails."""
    deadline = time.monotonic() + timeout
    while True:
        state = job_state(job_id)
        if state in TERMINAL_STATES or time.monotonic() >= deadline:
            return state
        time.sleep(poll)


def _ns_pids(ns: str) -> list[int]:
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
    return sorted(int(p) for p in r.stdout.split() if p.isdigit())


def _comm_and_state(pid: int) -> tuple[str, str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", "X"  # gone
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    return comm, stat[stat.rindex(")") + 2 :].split()[0]


def processes_in_node_namespaces(include_daemons: bool = False) -> dict[str, list[int]]:
    """{namespace: [pid, ...]} for every slurm-node* network namespace: what runs on each
    node. The node's own daemons (NODE_DAEMONS, always there) and exited processes not yet
    reaped are left out unless include_daemons, so after a job `not any(result.values())`
    means the nodes are clean."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    out: dict[str, list[int]] = {}
    for line in r.stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if not ns.startswith("slurm-node"):
            continue
        pids = []
        for pid in _ns_pids(ns):
            comm, state = _comm_and_state(pid)
            if state in ("Z", "X"):
                continue
            if comm in NODE_DAEMONS and not include_daemons:
                continue
            pids.append(pid)
        out[ns] = pids
    return out


def describe(pids: list[int]) -> str:
    """'PID cmdline' lines, for assertion messages."""
    lines = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "(gone)"
        lines.append(f"{pid} {cmd.strip()}")
    return "\n".join(lines)
