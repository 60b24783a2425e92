"""Helpers for tests that run against the real local Slurm cluster of scripts/slurm/up.sh.

    from helpers.slurm_cluster import require_cluster, sbatch, wait_job, processes_in_node_namespaces, daemon_problems

    def test_three_nodes(tmp_path):
        require_cluster(3)                       # skip (or fail with PDBENCH_REQUIRE_SLURM=1)
        job = sbatch("-N3", "--wrap", "srun -N3 -n3 hostname", cwd=tmp_path)
        assert wait_job(job, 60) == "COMPLETED"
        assert not any(processes_in_node_namespaces().values())
        assert daemon_problems() == []

Accounting is disabled on that cluster, so job states come from `scontrol show job`; a
finished job stays visible there for MinJobAge (300 s).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness.launch.slurm import TERMINAL
from helpers.node_daemons import answers, check_daemons, expected_daemons, leftovers

ROOT = Path(__file__).resolve().parents[2]
UP = ROOT / "scripts" / "slurm" / "up.sh"
DOWN = ROOT / "scripts" / "slurm" / "down.sh"
CONTAINERS_UP = ROOT / "scripts" / "slurm" / "containers-up.sh"
IMAGE_BUILD = ROOT / "scripts" / "image" / "build.sh"
DOCKER_SOCKETS = Path("/run/pdbench-docker")
#: up.sh's state directory: its run/ holds each node's slurmd pid file.
SLURM_DIR = Path(os.environ.get("PDBENCH_SLURM_DIR", "/tmp/pdbench-slurm"))

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


def pdbench_containers() -> dict[str, list[str]]:
    """{where: [container, ...]} of every pdbench container (running or not) on each node's
    dockerd and on podman: after a job, all lists must be empty. A node's dockerd that does
    not answer, or podman missing once the container suite ran, is an error: then nobody can
    say what is left."""
    out: dict[str, list[str]] = {}
    fmt = "{{.Names}} {{.Status}}"
    for sock in sorted(DOCKER_SOCKETS.glob("node*.sock")):
        if not answers(sock):
            raise RuntimeError(f"the dockerd of {sock.stem} does not answer on {sock}: it died or hangs")
        argv = ["docker", "-H", f"unix://{sock}", "ps", "-a", "--filter", "label=pdbench.job", "--format", fmt]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
        out[f"docker@{sock.stem}"] = r.stdout.splitlines()
    if shutil.which("podman") is None:
        if _image is not None:
            raise RuntimeError("podman is not installed, yet the container suite ran (containers-up.sh installs it)")
        return out
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


def _node_namespaces() -> dict[str, list[int]]:
    """{slurm-nodeI: [pid, ...]}: every node's network namespace and what runs in it."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.split()]
    return {ns: _ns_pids(ns) for ns in sorted(names) if ns.startswith("slurm-node")}


def _check_node_daemons() -> tuple[list[str], dict[str, list[int]]]:
    ns_pids = _node_namespaces()
    nodes = [ns.removeprefix("slurm-") for ns in ns_pids]
    daemons = expected_daemons(nodes, SLURM_DIR, DOCKER_SOCKETS, containers=_image is not None)
    problems, ours = check_daemons(daemons, ns_pids)
    return problems, leftovers(ns_pids, ours)


def daemon_problems() -> list[str]:
    """What is wrong with the nodes' own daemons (node_daemons.check_daemons): each node's
    slurmd, and once the container suite ran its dockerd and containerd, must be the one the
    cluster started, alive, and (dockerd) answering. [] when all is well."""
    return _check_node_daemons()[0]


def processes_in_node_namespaces() -> dict[str, list[int]]:
    """{namespace: [pid, ...]} for every slurm-node* network namespace: what runs on each
    node besides the daemons the cluster started (their pids, from their pid files) and
    exited processes not yet reaped, so after a job `not any(result.values())` means the
    nodes are clean. A second slurmd, dockerd or containerd is listed like any process."""
    return _check_node_daemons()[1]


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
