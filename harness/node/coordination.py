"""Cross-node coordination through the run directory, which every node shares.

A shared file system is what Slurm clusters give every job, and it needs no extra
service (no etcd, no barrier server that could hang): each node announces its address
in nodes/<id>.json; failures go to the job's failure records (harness.rundir.status);
node 0 writes state/done; each node writes state/exit-node<id>.json.
Every wait here is bounded and checks for an abort.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import time
from pathlib import Path

from harness import atomic
from harness.rundir import Failure, FailureRecords, RunDir


class Aborted(Exception):
    """Another node (or this one) gave up; the message says who and why."""


class Coordination:
    def __init__(self, run_dir: Path, node_id: int | str, num_nodes: int):
        self.run_dir, self.node_id, self.num_nodes = run_dir, node_id, num_nodes
        self.run = RunDir(run_dir)
        self.failures = FailureRecords(self.run)
        for d in (self.run.nodes, self.run.state):
            d.mkdir(parents=True, exist_ok=True)

    def _write_json(self, path: Path, data: dict) -> None:
        atomic.write_json(path, data)  # atomic: nobody sees a half-written file

    def announce(self, addr: str) -> None:
        self._write_json(
            self.run.node_address(self.node_id),
            {"node": self.node_id, "addr": addr, "host": socket.gethostname(), "pid": os.getpid()},
        )

    def wait_for_nodes(self, timeout: float, poll: float = 0.2) -> dict[int, str]:
        deadline = time.monotonic() + timeout
        while True:
            self.check_abort()
            found = {}
            for i in range(self.num_nodes):
                p = self.run.node_address(i)
                if p.is_file():
                    found[i] = json.loads(p.read_text())["addr"]
            if len(found) == self.num_nodes:
                return found
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.num_nodes)) - set(found))
                raise TimeoutError(f"nodes {missing} did not start within {timeout:.0f} s")
            time.sleep(poll)

    # --- failures: the job's failure records (harness.rundir.status) ---

    def record_failure(self, failure: Failure) -> None:
        """Record a failure; the first one of each kind stays, later ones are dropped."""
        self.failures.record(failure)

    def abort(self, reason: str) -> None:
        """Record a primary failure of this node that has no process of its own."""
        self.record_failure(Failure(self.node_id, reason))

    def has_failed(self) -> bool:
        return self.failures.has_failed()

    def root_cause(self) -> Failure | None:
        return self.failures.root_cause()

    def first_failure(self) -> Failure | None:
        """The job's reason: its first primary failure, else its first failure."""
        return self.failures.first()

    def abort_reason(self) -> str | None:
        return self.failures.abort_reason()

    def check_abort(self) -> None:
        reason = self.abort_reason()
        if reason:
            raise Aborted(reason)

    def mark_done(self) -> None:
        self._write_json(self.run.done, {"node": self.node_id, "time": time.time()})

    def is_done(self) -> bool:
        return self.run.done.is_file()

    def mark_phase_done(self, phase: str) -> None:
        """Node 0's client finished a phase that is not the job's last: every node moves on."""
        self._write_json(self.run.phase_done(phase), {"node": self.node_id, "time": time.time()})

    def is_phase_done(self, phase: str) -> bool:
        return self.run.phase_done(phase).is_file()

    def mark_exited(self, rc: int) -> None:
        """This node's runtime has torn everything down and is about to exit with rc."""
        self._write_json(self.run.exit_record(self.node_id), {"node": self.node_id, "rc": rc})

    def exited_nodes(self) -> set[int]:
        return {i for i in range(self.num_nodes) if self.run.exit_record(i).is_file()}

    def settle(self, timeout: float, poll: float = 0.2) -> None:
        """Wait (bounded) until a root cause is recorded or every other node has exited.

        A node that saw only a consequence (its client failed, a remote server stopped
        answering) calls this before it writes the job's status: the node that had the
        cause records it before it exits, so the status names the cause, not the echo.
        """
        others = set(range(self.num_nodes)) - {self.node_id}
        deadline = time.monotonic() + timeout
        while self.root_cause() is None and not others <= self.exited_nodes():
            if time.monotonic() > deadline:
                return
            time.sleep(poll)


def interface_address(name: str) -> str:
    """The IPv4 address of a network interface (SIOCGIFADDR); OSError when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            raise OSError(f"network interface {name!r} has no IPv4 address on this node ({e.strerror})") from None
    return socket.inet_ntoa(packed[20:24])


def discover_address(interface: str | None = None) -> str:
    """This node's address as the other nodes reach it.

    PDBENCH_NODE_ADDR wins (the local launcher sets 127.0.0.1); then the address of the
    interface the site names (site.node_interface); otherwise the address the host name
    resolves to (127.0.1.1 on Debian-style /etc/hosts: the runtime refuses a loopback one).
    """
    addr = os.environ.get("PDBENCH_NODE_ADDR")
    if addr:
        return addr
    if interface:
        return interface_address(interface)
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
