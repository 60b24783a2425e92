"""The job's shared secret: one random key per run directory, readable only by its owner.

The bundled KV connector's servers refuse a peer that cannot prove it knows this key
(connector/auth.py), so only the job's own decode workers can pull its KV. Every node
calls `ensure_job_secret` before starting its servers; the run directory is shared,
so the first node to get there creates the file and the others read it.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from harness.rundir import RunDir

_MIN_CHARS = 32
_WAIT_S = 10.0  # a loser of the race on a filesystem without link() waits this long for the bytes


def ensure_job_secret(run_dir: Path | str) -> Path:
    """`run_dir/state/kv_secret`, created once per job (mode 0600, 256 random bits as hex).

    Idempotent and safe when several nodes race on a shared filesystem: the file is
    written under a unique name and published with link(), which fails if another
    node published first; then that node's file is used. Raises OSError (a bad or
    unreadable secret file included), so a node fails before it starts any server.
    """
    path = RunDir(Path(run_dir)).secret
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        _publish(path, secrets.token_hex(32) + "\n")
    _check(path)
    return path


def _publish(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.uname().nodename}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic; the complete file appears, or FileExistsError
        except FileExistsError:
            pass  # another node won: use its secret
        except OSError:
            # No hard links here (some FUSE/object stores): exclusive create instead;
            # a loser may see the winner's file before its bytes, which _check waits for.
            try:
                fd2 = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return
            with os.fdopen(fd2, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
    finally:
        tmp.unlink(missing_ok=True)


def _check(path: Path) -> None:
    deadline = time.monotonic() + _WAIT_S
    while True:
        text = path.read_text().strip()
        if len(text) >= _MIN_CHARS:
            break
        if time.monotonic() > deadline:
            raise OSError(f"{path}: job secret is shorter than {_MIN_CHARS} characters; delete it to regenerate")
        time.sleep(0.1)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        try:
            os.chmod(path, 0o600)
        except OSError as exc:
            raise OSError(
                f"{path}: job secret is readable by others (mode {mode:o}) and cannot be restricted: {exc}"
            ) from None
