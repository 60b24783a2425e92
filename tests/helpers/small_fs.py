"""Real filesystems that refuse writes, for the tests of what pdbench does on them: a small tmpfs
(full after a few pages) or a read-only one, mounted as root. Without root (or where mounting is
not allowed) the test is skipped with the reason; CI runs as root."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(where: Path, size: str = "64k", read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (created), read-only if asked; unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small or read-only tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=0755" + (",ro" if read_only else "")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "pdbench-test", str(where)], capture_output=True, timeout=30
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill(path: Path) -> None:
    """Fill the filesystem holding `path` (a file it creates) until ENOSPC."""
    with open(path, "wb", buffering=0) as f:  # unbuffered: closing it has nothing left to write
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
