"""Cross-node coordination through the run directory, which every node shares.

A shared file system is what Slurm clusters give every job, and it needs no extra
service (no etcd, no barrier server that could hang): each node announces its address
in nodes/<id>.json; the first failure writes state/abort (and the first *cause*
state/root_cause); node 0 writes state/done; each node writes state/exit-node<id>.json.
Every wait here is bounded and checks for an abort.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from harness import atomic
from harness.rundir import TIME_LIMIT_WARNING


class Aborted(Exception):
    """Another node (or this one) gave up; the message says who and why."""


@dataclass(frozen=True)
class Failure:
    """One failure of a job: where it happened, in which process, why, and the end of its log.

    A *primary* failure is a cause (a process of this node died, this node's servers never
    got healthy, the job was cancelled); a secondary one may be the consequence of a cause
    elsewhere (the benchmark client failed because a server on another node died). The
    job's reason is its first primary failure, else its first failure of any kind.
    """

    node: int | str  # a node id, or "launcher" for the local launcher itself
    cause: str
    process: str | None = None
    role: str | None = None
    log: str | None = None  # the process's log, relative to the run directory
    log_tail: str | None = None
    primary: bool = True
    time: float = field(default_factory=time.time)

    @property
    def reason(self) -> str:
        where = "the local launcher" if self.node == "launcher" else f"node {self.node}"
        if self.process is None:
            return f"{where}: {self.cause}"
        text = f"{self.process} ({self.role}) on {where} {self.cause}"
        if self.log:
            text += f"; last lines of {self.log}:\n{self.log_tail or '  (empty)'}"
        return text

    def to_json(self) -> dict:
        return dict(asdict(self), reason=self.reason)

    @classmethod
    def from_json(cls, data: dict) -> Failure:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class Coordination:
    def __init__(self, run_dir: Path, node_id: int | str, num_nodes: int):
        self.run_dir, self.node_id, self.num_nodes = run_dir, node_id, num_nodes
        self.nodes_dir = run_dir / "nodes"
        self.state_dir = run_dir / "state"
        for d in (self.nodes_dir, self.state_dir):
            d.mkdir(parents=True, exist_ok=True)

    def _write_json(self, path: Path, data: dict, exclusive: bool = False) -> bool:
        # exclusive: exactly one writer wins (atomic's link), and nobody sees a half-written file.
        try:
            atomic.write_json(path, data, replace=not exclusive)
            return True
        except FileExistsError:
            return False

    def _read_json(self, path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None

    def announce(self, addr: str) -> None:
        self._write_json(
            self.nodes_dir / f"{self.node_id}.json",
            {"node": self.node_id, "addr": addr, "host": socket.gethostname(), "pid": os.getpid()},
        )

    def wait_for_nodes(self, timeout: float, poll: float = 0.2) -> dict[int, str]:
        deadline = time.monotonic() + timeout
        while True:
            self.check_abort()
            found = {}
            for i in range(self.num_nodes):
                p = self.nodes_dir / f"{i}.json"
                if p.is_file():
                    found[i] = json.loads(p.read_text())["addr"]
            if len(found) == self.num_nodes:
                return found
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.num_nodes)) - set(found))
                raise TimeoutError(f"nodes {missing} did not start within {timeout:.0f} s")
            time.sleep(poll)

    # --- failures: state/abort is the first of any kind (everyone stops on it);
    # state/root_cause the first primary one. Both are written once, atomically. ---

    def record_failure(self, failure: Failure) -> None:
        """Record a failure; the first one of each kind stays, later ones are dropped."""
        if failure.primary:  # before the stop signal, so whoever stops on it finds the cause
            self._write_json(self.state_dir / "root_cause", failure.to_json(), exclusive=True)
        self._write_json(self.state_dir / "abort", failure.to_json(), exclusive=True)

    def abort(self, reason: str) -> None:
        """Record a primary failure of this node that has no process of its own."""
        self.record_failure(Failure(self.node_id, reason))

    def has_failed(self) -> bool:
        return (self.state_dir / "abort").is_file()

    def root_cause(self) -> Failure | None:
        data = self._read_json(self.state_dir / "root_cause")
        return Failure.from_json(data) if data else None

    def first_failure(self) -> Failure | None:
        """The job's reason: its first primary failure, else its first failure."""
        data = self._read_json(self.state_dir / "root_cause") or self._read_json(self.state_dir / "abort")
        return Failure.from_json(data) if data else None

    def abort_reason(self) -> str | None:
        data = self._read_json(self.state_dir / "abort")
        return Failure.from_json(data).reason if data else None

    def check_abort(self) -> None:
        reason = self.abort_reason()
        if reason:
            raise Aborted(reason)

    def mark_done(self) -> None:
        self._write_json(self.state_dir / "done", {"node": self.node_id, "time": time.time()})

    def is_done(self) -> bool:
        return (self.state_dir / "done").is_file()

    def mark_phase_done(self, phase: str) -> None:
        """Node 0's client finished a phase that is not the job's last: every node moves on."""
        self._write_json(self.state_dir / f"done-{phase}", {"node": self.node_id, "time": time.time()})

    def is_phase_done(self, phase: str) -> bool:
        return (self.state_dir / f"done-{phase}").is_file()

    def mark_exited(self, rc: int) -> None:
        """This node's runtime has torn everything down and is about to exit with rc."""
        self._write_json(self.state_dir / f"exit-node{self.node_id}.json", {"node": self.node_id, "rc": rc})

    def exited_nodes(self) -> set[int]:
        return {i for i in range(self.num_nodes) if (self.state_dir / f"exit-node{i}.json").is_file()}

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


def write_status(run_dir: Path, rc: int, failure: Failure | None) -> None:
    """status.json: the job's outcome and, when it failed, its first failure. A job stopped by
    the warning before its time limit is "timeout": partial, not broken."""
    results = sorted(p.name for p in run_dir.glob("concurrency_*.json"))
    state = "succeeded" if rc == 0 else "failed"
    if failure is not None and failure.cause == TIME_LIMIT_WARNING:
        state = "timeout"
    status = {
        "state": state,
        "exit_code": rc,
        "reason": failure.reason if failure else None,
        "failure": failure.to_json() if failure else None,
        "results": results,
        "finished_at": time.time(),
    }
    atomic.write_json(run_dir / "status.json", status, indent=2)


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
