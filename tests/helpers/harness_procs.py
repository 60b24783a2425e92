"""`python -m harness ...` started as a background process, and a bounded wait for its endpoint."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def start_harness(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=out, stderr=subprocess.STDOUT)


def wait_ok(url: str, procs: list[subprocess.Popen], timeout: float = 60) -> None:
    """Until `url` answers 200, failing as soon as one of `procs` (what serves it) exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a process of the stack exited"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered 200")
