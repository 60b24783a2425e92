"""Helpers shared by the benchmarks and the tests: free ports, a mock engine to measure against.

Scripts in benchmarks/ put the project root on sys.path and import `benchmarks.common`;
pytest has the root on its path (pyproject's `pythonpath`).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_ports(n: int) -> list[int]:
    """n distinct ports nothing listens on now (all bound at once, so never the same twice)."""
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
