"""How a user runs pdbench again from here: the prefix of every `next:` hint, runnable as printed.

`pdbench` when that name is on PATH; else the script this process ran as (`.venv/bin/pdbench` when
the environment is not activated); else this interpreter with `-m harness`. A path under the
working directory is shown relative to it, as the user most likely typed it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def prog() -> str:
    """The words that run pdbench as printed, in a shell at the current directory."""
    if shutil.which("pdbench"):
        return "pdbench"
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name == "pdbench" and os.access(argv0, os.X_OK):
        return shlex.quote(_as_typed(argv0))
    return f"{shlex.quote(_as_typed(sys.executable))} -m harness"


def _as_typed(path: str) -> str:
    p = Path(path).absolute()
    try:
        rel = p.relative_to(Path.cwd())
    except ValueError:
        return str(p)
    # A bare name would be looked up on PATH, where it is not: keep it a path.
    return str(rel) if len(rel.parts) > 1 else f"./{rel}"
