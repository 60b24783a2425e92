"""`pdbench bench` on a pseudo-terminal, for the Ctrl-C tests."""

from __future__ import annotations

import fcntl
import os
import pty
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _take_terminal() -> None:
    # In the child, after setsid (start_new_session): the pty becomes its controlling
    # terminal, so ^C written to the master is SIGINT to its foreground process group.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """`pdbench bench ARGS` on a pty, its output collected as it comes."""

    def __init__(self, args: list[str], wrapper: tuple[str, ...] = ()) -> None:
        master, slave = pty.openpty()
        self.master = master
        env = os.environ | {"COLUMNS": "160", "LINES": "40", "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}
        env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "harness", "bench", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=REPO,
            env=env,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
        os.close(slave)
        self._out = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every writer of the slave is gone
                return
            if not data:
                return
            with self._lock:
                self._out += data

    @property
    def output(self) -> str:
        with self._lock:
            return self._out.decode(errors="replace")

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                raise AssertionError(f"bench exited ({self.proc.returncode}) before {what}:\n{self.output}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {timeout:g} s:\n{self.output}")
            time.sleep(0.02)

    def exit_code(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"bench still running {timeout:g} s later:\n{self.output}") from None
        self._reader.join(5)
        return rc

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        os.close(self.master)
