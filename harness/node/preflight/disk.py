"""Free space on the filesystem that takes the run's logs and results."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.node.preflight.text import fmt_bytes


def check_disk(path: str, need_bytes: int) -> list[str]:
    """At least `need_bytes` free on the filesystem holding `path` (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError as e:
        return [f"cannot read the free space of {path} ({e.strerror or e})"]
    if free < need_bytes:
        return [
            f"only {fmt_bytes(free)} free on the filesystem of {path}, {fmt_bytes(need_bytes)} needed "
            "(logs and results go there and would be lost when it fills); free space or use another results directory"
        ]
    return []
