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
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from harness import atomic

log = logging.getLogger(__name__)

# The environment variable that marks every process a Supervisor started (harness.reaper).
MARK_ENV = "PDBENCH_SUPERVISOR"


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
    def __init__(
        self,
        log_dir: Path,
        record: Path | None = None,
        adopt_orphans: bool = False,
        reaper: bool = False,
        reaper_args: Sequence[str] = (),
    ):
        """adopt_orphans: make this process a child subreaper, so descendants whose parent
        exited (a daemonising worker, a crashed server's children) are re-parented here
        and killed at teardown. Only for a process whose every child is supervised.
        reaper (with a record): start harness.reaper, which kills what this process started
        if it dies without tearing down; close() ends it. reaper_args: its RUN_DIR NODE, to
        record such a death as the node's failure."""
        self.log_dir = log_dir
        self.adopt_orphans = adopt_orphans and _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        self.record = record  # PIDs for the launcher's last-resort sweep
        self.procs: dict[str, Managed] = {}
        self._recorded: list[dict] = []
        # Every descendant ever seen, so one that left its group is still found after its
        # parent has exited: pid -> psutil.Process (which guards against PID reuse).
        self._seen: dict[int, psutil.Process] = {}
        self._owner: dict[int, str] = {}  # a descendant seen under a supervised process: pid -> its name
        self._stopped_since: dict[str, float] = {}  # name -> when it was first seen stopped
        # Every process started here carries it in its environment, and what they start inherits it.
        self.mark = f"{os.getpid()}-{psutil.Process().create_time()}"
        self._reaper: subprocess.Popen | None = None
        if reaper and record is not None:
            # Its own session: a signal to this process's group must not take it along. It holds
            # the pipe's read end; the write end stays here, close-on-exec, so no child keeps it open.
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "harness.reaper", str(os.getpid()), self.mark, str(record), *reaper_args],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )

    def close(self, timeout: float = 10.0) -> None:
        """After the last teardown: tell the reaper this process is done, and wait for it (bounded)."""
        if self._reaper is None:
            return
        assert self._reaper.stdin is not None
        try:
            self._reaper.stdin.write(b"done")  # torn down here: not a death to record
            self._reaper.stdin.close()
        except OSError:  # the reaper is gone (killed with the node's group, say)
            pass
        try:
            self._reaper.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("the reaper (pid %d) did not end within %.0f s", self._reaper.pid, timeout)
        self._reaper = None

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None) -> Managed:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**env, MARK_ENV: self.mark},
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
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
        atomic.write_json(self.record, self._recorded)

    def exited(self) -> list[tuple[str, int]]:
        """Processes that have ended, with their exit codes (also notes new descendants)."""
        self.refresh()
        return [(m.name, rc) for m in self.procs.values() if (rc := m.popen.poll()) is not None]

    def stopped(self) -> dict[str, float]:
        """Processes stopped (SIGSTOP, SIGTSTP: frozen, answering nothing), each with how long
        it has been seen so, in seconds."""
        now = time.monotonic()
        for name, m in self.procs.items():
            try:
                frozen = psutil.Process(m.pid).status() == psutil.STATUS_STOPPED
            except psutil.NoSuchProcess:
                frozen = False
            if not frozen:
                self._stopped_since.pop(name, None)
            else:
                self._stopped_since.setdefault(name, now)
        return {n: now - t for n, t in self._stopped_since.items() if n in self.procs}

    def refresh(self) -> None:
        if self.adopt_orphans:
            reaper = self._reaper.pid if self._reaper is not None else None
            for child in psutil.Process().children(recursive=True):
                if child.pid != reaper:  # it outlives every teardown, to the last
                    self._seen.setdefault(child.pid, child)
        for m in self.procs.values():
            try:
                for child in psutil.Process(m.pid).children(recursive=True):
                    self._seen.setdefault(child.pid, child)
                    self._owner.setdefault(child.pid, m.name)
            except psutil.NoSuchProcess:
                continue

    def wait(self, name: str, timeout: float) -> int | None:
        try:
            return self.procs[name].popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def interrupt(self, name: str, grace: float) -> None:
        """Ctrl-C, as a terminal sends it, to a running process that keeps its work on SIGINT
        (the benchmark client writes its running point as interrupted): SIGINT to its group, a
        second one half-way if it still runs, then wait the rest of `grace` for it to exit."""
        m = self.procs.get(name)
        if m is None or m.popen.poll() is not None:
            return
        for _ in range(2):
            signal_group(m.pid, signal.SIGINT)
            try:
                m.popen.wait(grace / 2)
                return
            except subprocess.TimeoutExpired:
                continue
        log.warning("%s (pid %d) still runs %.0f s after Ctrl-C; stopping it", name, m.pid, grace)

    def stop(self, name: str, grace: float) -> None:
        """One process and the descendants seen under it; every other process's stay running."""
        self._terminate([self.procs.pop(name)], grace, own_only=True)

    def stop_all(self, grace: float) -> None:
        """SIGTERM every group, SIGKILL what is left after `grace` seconds, reap everything."""
        procs, self.procs = list(self.procs.values()), {}
        # Stop the load first, then the proxy, then the servers, so nothing logs spurious errors.
        order = {"bench": 0, "proxy": 1}  # and bench-<phase>, proxy-<phase>
        procs.sort(key=lambda m: order.get(m.name.split("-")[0], 2))
        self._terminate(procs, grace)

    def _terminate(self, procs: list[Managed], grace: float, own_only: bool = False) -> None:
        self.refresh()
        own, names = {m.pid for m in procs}, {m.name for m in procs}
        # Descendants only: the supervised processes themselves are reaped through Popen,
        # so that their real exit status (e.g. -9) is kept. own_only: not the descendants seen
        # under another process (a server's engine cores), nor orphans of unknown parentage.
        tree = [
            p
            for pid, p in self._seen.items()
            if pid not in own and _alive(p) and (not own_only or self._owner.get(pid) in names)
        ]
        for m in procs:
            try:
                tree += [c for c in psutil.Process(m.pid).children(recursive=True) if c.pid not in self._seen]
            except psutil.NoSuchProcess:
                pass
            signal_group(m.pid, signal.SIGTERM)
            signal_group(m.pid, signal.SIGCONT)  # a stopped (frozen) process handles its SIGTERM too
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
            signal_group(m.pid, signal.SIGKILL)
        for p in alive:
            _signal_proc(p, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
        for m in procs:
            try:
                rc = m.popen.wait(5)
                log.info("stopped %s (pid %d, exit %s)", m.name, m.pid, rc)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) could not be reaped", m.name, m.pid)
        for pid in [pid for pid, p in self._seen.items() if not _alive(p)]:
            del self._seen[pid]
            self._owner.pop(pid, None)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_LIBC: ctypes.CDLL | None
try:  # loaded once here: preexec_fn runs in the forked child, where a lookup would be costly
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
except OSError:
    _LIBC = None


def _prctl(option: int, value: int) -> bool:
    return _LIBC is not None and _LIBC.prctl(option, value, 0, 0, 0) == 0


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the node runtime dies without tearing down (SIGKILL, OOM).

    Slurm's proctrack/linuxproc finds processes through their parents, so children
    orphaned by a killed runtime would otherwise outlive the job.
    """
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group `pid` leads; a group that is gone already is not an error."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_groups(leaders: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM the groups of these leaders, SIGKILL the groups still there after grace_s, reap."""
    for p in leaders:
        if p.poll() is None:
            signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in leaders:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(p.pid, signal.SIGKILL)
            p.wait(10)


def _signal_proc(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def recorded_processes(record: Path) -> list[dict[str, Any]]:
    """A node's process record (Supervisor's `record`: name, pid, create_time per process started);
    [] when it is missing or unreadable (a node that never started one, or was killed writing it)."""
    try:
        procs = json.loads(record.read_text())
    except (OSError, ValueError):
        return []
    return [p for p in procs if isinstance(p, dict)] if isinstance(procs, list) else []


def same_process(pid: int, create_time: float) -> psutil.Process | None:
    """The live process with this PID and start time, None when it ended (or a later process
    reuses the PID): what makes a recorded PID safe to signal."""
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - create_time) > 0.1 or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except psutil.NoSuchProcess:
        return None


def group_members(pgid: int, leader_created: float) -> list[psutil.Process]:
    """Live processes of the group the recorded leader created, with their descendants; the
    leader itself may be gone. A member was created after its leader, which tells this group
    from a later one that reuses the number (which can happen only once the group is empty,
    so a leader alive under another start time is another group)."""
    if _reused(pgid, leader_created):
        return []
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["create_time"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["create_time"] >= leader_created - 1 and _alive(p):
                found[p.pid] = p
                for c in p.children(recursive=True):
                    found.setdefault(c.pid, c)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return [p for p in found.values() if p.pid != os.getpid()]


def _reused(pgid: int, leader_created: float) -> bool:
    """Another process, started at another time, now leads a group of this number."""
    try:
        return abs(psutil.Process(pgid).create_time() - leader_created) > 0.1 and os.getpgid(pgid) == pgid
    except (psutil.NoSuchProcess, ProcessLookupError):
        return False


def live_recorded(record: Path) -> list[psutil.Process]:
    """What lives of a node's process record: each recorded process's group, with descendants."""
    out = []
    for entry in recorded_processes(record):
        pid, created = entry.get("pid"), entry.get("create_time")
        if isinstance(pid, int) and isinstance(created, (int, float)):
            out += group_members(pid, created)
    return out


def kill_recorded(records: Sequence[Path]) -> list[str]:
    """SIGKILL what nodes recorded and did not reap (their runtime was SIGKILLed, say): each
    recorded process's group, even when the leader is gone, and its descendants. Returns what it
    killed, as "name: pids" lines for a log."""
    killed = []
    for record in records:
        for entry in recorded_processes(record):
            pid, created = entry.get("pid"), entry.get("create_time")
            if not isinstance(pid, int) or not isinstance(created, (int, float)):
                continue
            victims = group_members(pid, created)
            if not victims:
                continue
            killed.append(f"{entry.get('name')} (process group {pid}): pids {[v.pid for v in victims]}")
            for v in victims:
                _signal_proc(v, signal.SIGKILL)
            psutil.wait_procs(victims, timeout=5)
    return killed
