"""The daemons the local Slurm cluster started on its nodes, counted by their pid files, for
the "nothing left behind" check of tests/e2e/test_slurm.py (via slurm_cluster.py).

Each node of scripts/slurm/up.sh runs exactly one slurmd (pid file SLURM_DIR/run/slurmd-NODE.pid);
once scripts/slurm/containers-up.sh ran, also one dockerd (DOCKER_DIR/NODE.pid, answering on
DOCKER_DIR/NODE.sock) and the containerd that dockerd supervises (DOCKER_DIR/NODE/containerd/
containerd.pid; absent where dockerd uses a host-wide containerd). Those processes, and only
those, are the node's own: a second slurmd, dockerd or containerd is a leftover like any other
process, and a recorded daemon that died, or a dockerd that stopped answering, is a failure.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NodeDaemon:
    node: str  # the Slurm node name, e.g. node2; its network namespace is slurm-node2
    name: str  # the program, as /proc/PID/comm names it
    pid_file: Path
    sock: Path | None = None  # where it must answer (dockerd)


def expected_daemons(nodes: list[str], slurm_dir: Path, docker_dir: Path, containers: bool) -> list[NodeDaemon]:
    """The daemons each of `nodes` must run: its slurmd; with `containers` (containers-up.sh ran,
    or its dockerd pid file is there) its dockerd, and the containerd that dockerd started."""
    out = []
    for node in nodes:
        out.append(NodeDaemon(node, "slurmd", slurm_dir / "run" / f"slurmd-{node}.pid"))
        if containers or (docker_dir / f"{node}.pid").exists():
            out.append(NodeDaemon(node, "dockerd", docker_dir / f"{node}.pid", docker_dir / f"{node}.sock"))
            containerd = docker_dir / node / "containerd" / "containerd.pid"
            if containerd.exists():
                out.append(NodeDaemon(node, "containerd", containerd))
    return out


def comm_and_state(pid: int) -> tuple[str, str]:
    """(/proc/PID/comm, one-letter state); ("", "X") for a process that is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", "X"
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    return comm, stat[stat.rindex(")") + 2 :].split()[0]


def running(pid: int) -> bool:
    """Alive, not a zombie waiting to be reaped."""
    return comm_and_state(pid)[1] not in ("Z", "X")


def answers(sock: Path, timeout: float = 5) -> bool:
    """Whether a daemon accepts connections on the unix socket `sock`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(sock))
        except OSError:  # refused (its daemon was killed), missing, or no answer in time
            return False
    return True


def _read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def check_daemons(daemons: list[NodeDaemon], ns_pids: dict[str, list[int]]) -> tuple[list[str], set[int]]:
    """(problems, pids): what is wrong with the cluster's own daemons, each a sentence naming
    node, daemon, pid and pid file; and the pids that are those daemons. `ns_pids` maps each
    node's network namespace (slurm-NODE) to the processes in it."""
    problems: list[str] = []
    ours: set[int] = set()
    for d in daemons:
        what = f"{d.node}'s {d.name}"
        pid = _read_pid(d.pid_file)
        if pid is None:
            problems.append(f"{what} has no pid in {d.pid_file}: it is not running or was never started")
            continue
        comm, state = comm_and_state(pid)
        if state in ("Z", "X") or comm != d.name:
            problems.append(f"{what} (pid {pid} in {d.pid_file}) is not running: it died")
            continue
        if pid not in ns_pids.get(f"slurm-{d.node}", []):
            problems.append(f"{what} (pid {pid} in {d.pid_file}) is not in {d.node}'s network namespace")
            continue
        ours.add(pid)
        if d.sock is not None and not answers(d.sock):
            problems.append(f"{what} (pid {pid}) does not answer on {d.sock}")
    return problems, ours


def leftovers(ns_pids: dict[str, list[int]], ours: set[int]) -> dict[str, list[int]]:
    """{namespace: [pid, ...]} of the running processes in each node namespace that are not the
    cluster's own daemons (`ours`): a second slurmd, dockerd or containerd included."""
    return {ns: [p for p in pids if p not in ours and running(p)] for ns, pids in ns_pids.items()}
