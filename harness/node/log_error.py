"""The first error a process's log names: what a failure's reason puts ahead of the log's tail.

A vLLM API server whose engine core died answers 500s for a while and then exits 0; the cause (a
CUDA error, an out-of-memory, an NCCL error, a Python exception in the engine core) sits hundreds
of lines above the tail a failure quotes. Hand-written patterns, deliberately: no log library knows
vLLM's, torch's and NCCL's messages, and a wrong guess here only adds a line to the reason.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# How much of a log's end is read: a server's failure is near its end, and the read stays bounded
# whatever the log's size.
SCAN_BYTES = 1 << 20

# vLLM's and Python logging's prefixes: "(EngineCore pid=5273) ERROR 12-01 04:31:41 [core.py:9] ".
_PREFIX = re.compile(
    r"^(\([\w.-]+ pid=\d+\)\s*)?(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+[\d-]+ [\d:.]+ \[[^\]]*\]\s*)?"
)
# A line logged below ERROR states no cause, whatever words it quotes.
_QUIET = {"DEBUG", "INFO", "WARNING"}
# Messages that are causes, in the words torch, CUDA, NCCL and Python use. A kernel library's
# host-side check (FlashMLA's "Assertion failed (file.cu:64): cond") and CUDA's device-side
# assert ("...: block: [0,0,0], thread: [0,0,0] Assertion `cond` failed.") come before the CUDA
# error they cause, so they are what a failure names.
_CAUSE = re.compile(
    r"(Assertion failed \(.+"
    r"|^.*: block: \[[\d,]+\], thread: \[[\d,]+\] Assertion .+"
    r"|CUDA error: .+"
    r"|(torch\.)?(cuda\.)?OutOfMemoryError: .+"
    r"|CUDA out of memory.+"
    r"|NCCL error.+"
    r"|Fatal Python error: .+"
    r"|Segmentation fault.*"
    r"|^([A-Za-z_][\w.]*\.)?[A-Z]\w*(Error|Exception): .+)"
)
# Echoes of a cause told above them: named only when nothing else is.
_ECHO = re.compile(r"EngineDeadError|EngineCore encountered an issue|See stack trace \(above\)|BrokenPipeError")


def first_error(path: Path, scan_bytes: int = SCAN_BYTES) -> str | None:
    """The first line in the last `scan_bytes` of `path` that states a cause (its logging prefix
    dropped), else the first echo of one, else None (also for a log that cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - scan_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    echo = None
    for raw in text.splitlines():
        prefix = _PREFIX.match(raw.strip())
        if prefix and prefix.group("level") in _QUIET:
            continue
        line = raw.strip()[prefix.end() if prefix else 0 :].strip()
        if line.startswith("what():"):  # C++'s terminate: "what():  CUDA error: ..."
            line = line.removeprefix("what():").strip()
        m = _CAUSE.search(line)
        if not m:
            continue
        if _ECHO.search(line):
            echo = echo or line
            continue
        return m.group(0)[:300]
    return echo[:300] if echo else None
