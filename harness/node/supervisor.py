"""Start, watch and tear down the processes of one node, each tracked by its real PID.

Each process runs in its own session (process group) with its output in a log file,
never behind a pipe, so the PID is the server's own and killing the group reaches the
workers vLLM forks. Descendants are also collected with psutil before the kill, in case
one of them left the group.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import psutil

log = logging.getLogger("pdbench.node")


@dataclass
class Managed:
    name: str
    popen: subprocess.Popen
    log_path: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid


class Supervisor:
    def __init__(self, log_dir: Path, record: Path | None = None):
        self.log_dir = log_dir
        self.record = record  # PIDs for the launcher's last-resort sweep
        self.procs: dict[str, Managed] = {}
        self._recorded: list[dict] = []

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None) -> Managed:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=dict(env), cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent,
            )
        m = Managed(name, popen, log_path)
        self.procs[name] = m
        self._record(m)
        log.info("started %s (pid %d), log %s", name, popen.pid, log_path)
        return m

    def _record(self, m: Managed) -> None:
        if self.record is None:
            return
        try:
            created = psutil.Process(m.pid).create_time()
        except psutil.NoSuchProcess:
            return
        self._recorded.append({"name": m.name, "pid": m.pid, "create_time": created})
        tmp = self.record.with_name(self.record.name + ".tmp")
        tmp.write_text(json.dumps(self._recorded) + "\n")
        os.replace(tmp, self.record)

    def exited(self) -> list[tuple[str, int]]:
        """Processes that have ended, with their exit codes."""
        return [(m.name, rc) for m in self.procs.values() if (rc := m.popen.poll()) is not None]

    def wait(self, name: str, timeout: float) -> int | None:
        try:
            return self.procs[name].popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, name: str, grace: float) -> None:
        self._terminate([self.procs.pop(name)], grace)

    def stop_all(self, grace: float) -> None:
        """SIGTERM every group, SIGKILL what is left after `grace` seconds, reap everything."""
        procs, self.procs = list(self.procs.values()), {}
        # Stop the load first, then the proxy, then the servers, so nothing logs spurious errors.
        order = {"bench": 0, "proxy": 1}
        procs.sort(key=lambda m: order.get(m.name, 2))
        self._terminate(procs, grace)

    def _terminate(self, procs: list[Managed], grace: float) -> None:
        tree: list[psutil.Process] = []
        for m in procs:
            try:
                root = psutil.Process(m.pid)
                tree += [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
            _signal_group(m.pid, signal.SIGTERM)
        for p in tree:
            _signal_proc(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for m in procs:
            try:
                m.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        _, alive = psutil.wait_procs(tree, timeout=max(0.0, deadline - time.monotonic()))
        for m in procs:
            if m.popen.poll() is None:
                log.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing", m.name, m.pid, grace)
            _signal_group(m.pid, signal.SIGKILL)
        for p in alive:
            _signal_proc(p, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
        for m in procs:
            try:
                rc = m.popen.wait(5)
                log.info("stopped %s (pid %d, exit %s)", m.name, m.pid, rc)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) could not be reaped", m.name, m.pid)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the node runtime dies without tearing down (SIGKILL, OOM).

    Slurm's proctrack/linuxproc finds processes through their parents, so children
    orphaned by a killed runtime would otherwise outlive the job.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_proc(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
