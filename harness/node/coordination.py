"""Cross-node coordination through the run directory, which every node shares.

A shared file system is what Slurm clusters give every job, and it needs no extra
service (no etcd, no barrier server that could hang): each node announces its address
in nodes/<id>.json; the first failure writes state/abort; node 0 writes state/done.
Every wait here is bounded and checks for an abort.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Callable


class Aborted(Exception):
    """Another node (or this one) gave up; the message says who and why."""


class Coordination:
    def __init__(self, run_dir: Path, node_id: int, num_nodes: int):
        self.run_dir, self.node_id, self.num_nodes = run_dir, node_id, num_nodes
        self.nodes_dir = run_dir / "nodes"
        self.state_dir = run_dir / "state"
        for d in (self.nodes_dir, self.state_dir):
            d.mkdir(parents=True, exist_ok=True)

    def _write_json(self, path: Path, data: dict, exclusive: bool = False) -> bool:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data) + "\n")
        try:
            if exclusive:
                os.link(tmp, path)
            else:
                os.replace(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def announce(self, addr: str) -> None:
        self._write_json(self.nodes_dir / f"{self.node_id}.json",
                         {"node": self.node_id, "addr": addr, "host": socket.gethostname(), "pid": os.getpid()})

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

    def abort(self, reason: str) -> None:
        """Record the first failure of the job; later ones keep the first reason."""
        self._write_json(self.state_dir / "abort", {"node": self.node_id, "reason": reason}, exclusive=True)

    def abort_reason(self) -> str | None:
        p = self.state_dir / "abort"
        if not p.is_file():
            return None
        data = json.loads(p.read_text())
        return f"node {data['node']}: {data['reason']}"

    def check_abort(self) -> None:
        reason = self.abort_reason()
        if reason:
            raise Aborted(reason)

    def mark_done(self) -> None:
        self._write_json(self.state_dir / "done", {"node": self.node_id, "time": time.time()})

    def is_done(self) -> bool:
        return (self.state_dir / "done").is_file()


def discover_address() -> str:
    """This node's address as the other nodes reach it.

    PDBENCH_NODE_ADDR wins (the local launcher sets 127.0.0.1); otherwise the address
    the host name resolves to.
    """
    addr = os.environ.get("PDBENCH_NODE_ADDR")
    if addr:
        return addr
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def wait_until(pred: Callable[[], bool], timeout: float, what: str, poll: float = 0.5,
               check: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if check:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(poll)
