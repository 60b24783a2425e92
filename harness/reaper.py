"""A node runtime's reaper: ends what the runtime started when the runtime dies without
tearing down (SIGKILL, the OOM killer), so nothing of a node outlives it, launcher or not.

PR_SET_PDEATHSIG reaches only the runtime's own children: a server's forked workers (its
process group) and a grandchild that left the group live on. The reaper is a process of its
own session that the runtime starts first (Supervisor(reaper=True)). It learns of the
runtime's end from a pipe that only the runtime holds (EOF, however the runtime ended),
notes the runtime's descendants once a second until then, and then kills every one it saw
that still lives, every process that carries the runtime's mark in its environment (every
process the Supervisor starts does, and what they start inherits it: an orphan that left
its group is found too) and every process group the runtime recorded. After a clean
teardown that finds nothing.

A runtime that ended without saying DONE on the pipe died; given its run directory and node,
the reaper records that as the node's failure first, so the other nodes stop on it and the
job's status names the node (not what its death did elsewhere).

    python -m harness.reaper PID MARK RECORD [RUN_DIR NODE]
        stdin: the pipe; PID: the runtime's; MARK: its MARK_ENV value; RECORD: its process record
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
from pathlib import Path

import psutil

from harness import exit_codes
from harness.rundir import Failure, FailureRecords, RunDir
from harness.supervisor import MARK_ENV, kill_recorded

log = logging.getLogger("harness.reaper")

POLL_S = 1.0
DONE = b"done"  # what the runtime writes before it closes the pipe after its own teardown
DIED = (
    "its node runtime (pdbench node) died without tearing down (SIGKILL or the OOM killer); "
    "its reaper killed the node's processes"
)


def watch(parent: psutil.Process, pipe: int, poll_s: float = POLL_S) -> tuple[dict[int, psutil.Process], bool]:
    """Every descendant of `parent` seen until `pipe` reads EOF (psutil.Process guards each
    against a reused PID), and whether the runtime said DONE first (it tore down itself)."""
    seen: dict[int, psutil.Process] = {}
    me = os.getpid()
    said = b""
    while True:
        try:
            for c in parent.children(recursive=True):
                if c.pid != me:
                    seen.setdefault(c.pid, c)
        except psutil.NoSuchProcess:
            pass  # the parent is gone; its pipe reads EOF at once
        ready, _, _ = select.select([pipe], [], [], poll_s)
        if ready:
            data = os.read(pipe, 4096)
            if not data:
                return seen, DONE in said
            said += data


def marked(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries this mark (not this one)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(MARK_ENV) == mark:
                out.append(p)
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
    return out


def reap(seen: dict[int, psutil.Process], mark: str, record: Path) -> list[str]:
    """SIGKILL what is left of the runtime's descendants, marked processes and recorded groups;
    what was killed."""
    left = []
    for p in [*seen.values(), *marked(mark)]:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            continue
    for p in left:
        try:
            p.send_signal(signal.SIGKILL)  # psutil checks it is still the process it saw
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    psutil.wait_procs(left, timeout=5)
    killed = [f"its processes: pids {sorted({p.pid for p in left})}"] if left else []
    return killed + kill_recorded([record])


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s pdbench-reaper[%(process)d] %(levelname)s %(message)s")
    if len(argv) not in (3, 5) or not argv[0].isdigit() or (len(argv) == 5 and not argv[4].isdigit()):
        log.error(
            "usage: python -m harness.reaper PID MARK RECORD [RUN_DIR NODE] (stdin: the pipe the node runtime holds)"
        )
        return exit_codes.USAGE
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the runtime's to handle
    # Watched only while it is still this process's parent: one that died already left nothing to watch.
    parent = int(argv[0])
    seen, clean = watch(psutil.Process(parent), sys.stdin.fileno()) if os.getppid() == parent else ({}, False)
    if not clean and len(argv) == 5:
        # The node's cause, recorded before its processes die: the other nodes stop on it, and the
        # job's status names this node rather than what its death did elsewhere (a client's errors).
        FailureRecords(RunDir(Path(argv[3]))).record(Failure(int(argv[4]), DIED))
    for line in reap(seen, argv[1], Path(argv[2])):
        log.warning("the node runtime ended without tearing down; killed %s", line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
