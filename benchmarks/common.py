"""Helpers shared by the benchmarks and the tests: free ports, a mock engine to measure against,
and what every benchmark prints beside its figures (load, the peers' order per round, spread).

Scripts in benchmarks/ put the project root on sys.path and import `benchmarks.common`;
pytest has the root on its path (pyproject's `pythonpath`).
"""

from __future__ import annotations

import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


# Ports handed out lie below the kernel's ephemeral range, so no port the kernel picks (a bind to
# port 0 or the local end of an outgoing connection, which every test and vLLM make plenty of)
# can take one between being handed out and being bound. Each pytest-xdist worker draws from its
# own slice, walking it from a random start, so parallel tests never get the same port either.
# The slices lie above the tests' fixed ports (conftest.port_base: 15640-21400) and below the
# recipes' proxy port (30000).
_PORTS_FLOOR = 22000
_PORTS_CEILING = 30000
_next_port: int | None = None


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_slice() -> tuple[int, int]:
    top = min(_ephemeral_low(), _PORTS_CEILING)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (top - _PORTS_FLOOR) // max(count, 1)
    lo = _PORTS_FLOOR + index * width
    return lo, lo + width


def _bindable(port: int) -> bool:
    """Free the way a server binds it (SO_REUSEADDR, every address), and on loopback alone."""
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_ports(n: int) -> list[int]:
    """n distinct ports nothing uses now, none of which the kernel will hand to anything else."""
    global _next_port
    lo, hi = _port_slice()
    if hi - lo < 4 * n:  # an unusual ephemeral range leaves no room below it: let the kernel pick
        return _kernel_ports(n)
    if _next_port is None or not lo <= _next_port < hi:
        _next_port = random.randrange(lo, hi)
    out: list[int] = []
    for _ in range(hi - lo):
        port = _next_port
        _next_port = lo + (_next_port + 1 - lo) % (hi - lo)
        if _bindable(port):
            out.append(port)
            if len(out) == n:
                return out
    raise RuntimeError(f"no {n} free ports in {lo}-{hi - 1}")


def _kernel_ports(n: int) -> list[int]:
    """n distinct ports the kernel picks (all bound at once, so never the same twice)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def start_mock_engine(
    port: int, log: Path, *args: str, preexec_fn: Callable[[], None] | None = None, timeout_s: float = 60.0
) -> subprocess.Popen[bytes]:
    """`pdbench mock-engine --port PORT ARGS...` in its own process, once /health answers."""
    cmd = [sys.executable, "-m", "harness", "mock-engine", "--port", str(port), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mock engine exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    proc.wait(10)
    raise SystemExit(f"mock engine did not become healthy in {timeout_s:.0f} s")


# -- what every benchmark prints beside its figures -------------------------------------------


def load_text() -> str:
    """The machine's load now (1/5/15-minute load average) and its CPUs, to print beside a figure."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} CPUs"


def conditions_text() -> str:
    """When (UTC) and under what load a figure was measured."""
    return f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {load_text()}"


def rotated(items: Sequence[T], round_index: int) -> list[T]:
    """The peers' order in round `round_index`: rotated by one each round, so each goes first in
    turn (two peers alternate) and none always runs on a machine the other just warmed or loaded."""
    if not items:
        return []
    k = round_index % len(items)
    return [*items[k:], *items[:k]]


def spread(xs: Sequence[float], fmt: str = ".2f", unit: str = "") -> str:
    """`median (min .. max, n N)` of per-round (or per-request) values, for printing."""
    if not xs:
        raise ValueError("spread of no values")
    med, lo, hi = statistics.median(xs), min(xs), max(xs)
    return f"{med:{fmt}}{unit} (min {lo:{fmt}} .. max {hi:{fmt}}, n {len(xs)})"
