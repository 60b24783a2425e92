"""Paths a recipe gives relative to pdbench's own checkout (a tool's venv, a task directory).

The checkout that runs the code resolves them: on the nodes that is the tree the job runs, which
a container job mounts at the same path, so a relative path names the same file there.
"""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def in_checkout(path: str, root: Path = CHECKOUT) -> Path:
    """`path` as is when absolute, else under `root` (pdbench's checkout)."""
    p = Path(path)
    return p if p.is_absolute() else root / p
