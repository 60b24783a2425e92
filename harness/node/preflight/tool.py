"""An external tool (nvidia-smi, amd-smi) run by a check, bounded so that it cannot hang the check."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


class ToolFailed(Exception):
    """An external tool could not be run, failed, or did not answer in time; str() says which."""


def run_tool(argv: Sequence[str], timeout: float, env: Mapping[str, str], limit_s: float) -> tuple[str, int]:
    """stdout and pid of `argv`, bounded by `timeout` seconds (what is left of the check's
    `limit_s`, which the message names).

    The tool runs in its own session so that on timeout its whole process group is killed
    (a wrapper script's children included); a process stuck in the kernel (a hung driver)
    cannot be killed at all, so after the kill we wait at most a second for its output.
    """
    shown = " ".join([Path(argv[0]).name, *argv[1:]])
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=dict(env),
            start_new_session=True,
        )
    except OSError as e:
        raise ToolFailed(f"could not run `{shown}`: {e.strerror or e}") from None
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.05))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise ToolFailed(f"`{shown}` did not answer within {limit_s:g} s") from None
    if proc.returncode != 0:
        tail = " / ".join(line.strip() for line in (err or out or "").strip().splitlines()[-2:] if line.strip())
        raise ToolFailed(f"`{shown}` failed (exit {proc.returncode}{': ' + tail if tail else ''})")
    return out, proc.pid


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.communicate(timeout=1)
    except subprocess.TimeoutExpired:
        pass
