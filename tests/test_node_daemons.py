"""The "nothing left behind" check of the Slurm tests (tests/helpers/node_daemons.py) against real
processes named slurmd, dockerd and containerd (sleep, exec'd under those names), real pid
files and real unix sockets; a node namespace is stood in for by the list of its pids."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.node_daemons import NodeDaemon, check_daemons, comm_and_state, expected_daemons, leftovers


class Node:
    """node1's daemons as the cluster's scripts leave them: processes, pid files, a socket."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.slurm_dir, self.docker_dir = tmp / "slurm", tmp / "docker"
        (self.slurm_dir / "run").mkdir(parents=True)
        (self.docker_dir / "node1" / "containerd").mkdir(parents=True)
        self.procs: list[subprocess.Popen] = []
        self.slurmd = self.start("slurmd", self.slurm_dir / "run" / "slurmd-node1.pid")
        self.dockerd = self.start("dockerd", self.docker_dir / "node1.pid")
        self.containerd = self.start("containerd", self.docker_dir / "node1" / "containerd" / "containerd.pid")
        self.sock = self.docker_dir / "node1.sock"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.sock))
        self.listener.listen()

    def start(self, name: str, pid_file: Path | None = None) -> subprocess.Popen:
        """A process whose /proc/PID/comm is `name`."""
        exe = self.tmp / "bin" / name
        if not exe.exists():
            exe.parent.mkdir(exist_ok=True)
            exe.symlink_to(shutil.which("sleep") or "/bin/sleep")
        proc = subprocess.Popen([str(exe), "300"])
        self.procs.append(proc)
        assert comm_and_state(proc.pid)[0] == name  # the precondition: it is named as a daemon is
        if pid_file is not None:
            pid_file.write_text(f"{proc.pid}\n")
        return proc

    def ns_pids(self) -> dict[str, list[int]]:
        return {"slurm-node1": [p.pid for p in self.procs if p.poll() is None]}

    def check(self, containers: bool = True) -> tuple[list[str], dict[str, list[int]]]:
        daemons = expected_daemons(["node1"], self.slurm_dir, self.docker_dir, containers)
        problems, ours = check_daemons(daemons, self.ns_pids())
        return problems, leftovers(self.ns_pids(), ours)

    def stop(self) -> None:
        self.listener.close()
        for p in self.procs:
            p.kill()
            p.wait(timeout=10)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.stop()


def test_the_started_daemons_are_clean(node: Node) -> None:
    assert node.check() == ([], {"slurm-node1": []})


def test_a_dead_daemon_is_a_failure(node: Node) -> None:
    node.slurmd.kill()
    node.slurmd.wait(timeout=10)
    problems, left = node.check()
    pid_file = node.slurm_dir / "run" / "slurmd-node1.pid"
    assert problems == [f"node1's slurmd (pid {node.slurmd.pid} in {pid_file}) is not running: it died"]
    assert left == {"slurm-node1": []}


def test_a_second_daemon_is_a_leftover(node: Node) -> None:
    leaked = node.start("dockerd")  # a dockerd of an earlier containers-up.sh, say
    problems, left = node.check()
    assert problems == []
    assert left == {"slurm-node1": [leaked.pid]}


def test_a_dockerd_that_does_not_answer_is_a_failure(node: Node) -> None:
    node.listener.close()  # the socket file stays, as a killed dockerd leaves it
    assert node.sock.exists()
    problems, _ = node.check()
    assert problems == [f"node1's dockerd (pid {node.dockerd.pid}) does not answer on {node.sock}"]


def test_a_missing_dockerd_is_a_failure_once_containers_are_up(node: Node) -> None:
    node.dockerd.kill()
    node.dockerd.wait(timeout=10)
    (node.docker_dir / "node1.pid").unlink()  # a dockerd stopped cleanly removes its pid file
    problems, _ = node.check(containers=True)
    assert problems == [
        f"node1's dockerd has no pid in {node.docker_dir / 'node1.pid'}: it is not running or was never started"
    ]
    # Before the container suite ran, a node needs no dockerd: then its containerd is a leftover.
    assert node.check(containers=False) == ([], {"slurm-node1": [node.containerd.pid]})


def test_a_daemon_outside_its_node_is_a_failure(node: Node) -> None:
    daemons = [NodeDaemon("node1", "slurmd", node.slurm_dir / "run" / "slurmd-node1.pid")]
    problems, ours = check_daemons(daemons, {"slurm-node1": [], "slurm-node2": [node.slurmd.pid]})
    assert ours == set()
    assert problems == [
        f"node1's slurmd (pid {node.slurmd.pid} in {daemons[0].pid_file}) is not in node1's network namespace"
    ]


def test_a_pid_file_naming_another_program_is_a_failure(node: Node) -> None:
    other = node.start("sleep")  # the pid was reused by something else
    (node.slurm_dir / "run" / "slurmd-node1.pid").write_text(str(other.pid))
    problems, left = node.check()
    assert problems == [
        f"node1's slurmd (pid {other.pid} in {node.slurm_dir / 'run' / 'slurmd-node1.pid'}) is not running: it died"
    ]
    assert sorted(left["slurm-node1"]) == sorted([node.slurmd.pid, other.pid])
