"""Atomic file writes: the one implementation every writer of the run directory uses.

A temp file beside the target is written, flushed to disk, then published with
`os.replace` (replace=True) or `os.link` (replace=False: fails with FileExistsError when
the name exists, also on NFS where the server decides, so exactly one writer wins and a
result is never overwritten). Readers never see a partial file; no temp file is left.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def write_with(path: Path, write: Callable[[IO[bytes]], Any], *, replace: bool = True, mode: int = 0o644) -> Path:
    """Publish what `write` puts into a binary file object at `path`, atomically."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _naming(e, path) from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:  # a full disk's write names no file: the error names the target
        raise _naming(e, path) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _naming(e: OSError, path: Path) -> OSError:
    """`e` with the target's name (not the temp file's, nor none, as a failed write has)."""
    return OSError(e.errno, e.strerror or str(e), str(path))  # the errno's subclass, as the original


def write_bytes(path: Path, data: bytes, *, replace: bool = True, mode: int = 0o644) -> Path:
    return write_with(path, lambda f: f.write(data), replace=replace, mode=mode)


def write_text(path: Path, text: str, *, replace: bool = True, mode: int = 0o644) -> Path:
    return write_bytes(path, text.encode(), replace=replace, mode=mode)


def write_json(path: Path, obj: Any, *, indent: int | None = None, replace: bool = True) -> Path:
    return write_text(path, json.dumps(obj, indent=indent) + "\n", replace=replace)
