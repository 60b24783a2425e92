"""Run directories: results/<recipe>/<UTC timestamp>-<short id>/, created once, never reused."""

from __future__ import annotations

import secrets
import time
from pathlib import Path


def create_run_dir(results_root: Path, recipe_name: str) -> Path:
    parent = results_root / recipe_name
    parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = parent / f"{stamp}-{secrets.token_hex(3)}"
        try:
            path.mkdir()  # exist_ok=False: a run directory is never reused
        except FileExistsError:
            continue
        (path / "logs").mkdir()
        return path
    raise RuntimeError(f"could not create a new run directory under {parent}")
