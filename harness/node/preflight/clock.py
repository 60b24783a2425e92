"""This node's clock against the shared filesystem's: cross-node timings need them in sync."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

_now = time.time  # check_clock's clock; tests replace it to simulate skew


def check_clock(shared_dir: Path, max_skew_s: float = 1.0) -> list[str]:
    """This node's clock agrees with the shared filesystem's (the file server stamps the mtime
    of a file written to the run directory): cross-node timings need clocks in sync."""
    shared_dir = Path(shared_dir)
    try:
        fd, name = tempfile.mkstemp(prefix=".clock-", dir=shared_dir)
    except OSError as e:
        return [
            f"cannot write to the shared run directory {shared_dir} ({e.strerror or e}); every node writes its "
            "state there: is it mounted read-write on this node?"
        ]
    try:
        before = _now()
        with os.fdopen(fd, "wb") as f:
            f.write(b"clock\n")
            f.flush()
            os.fsync(f.fileno())
        after = _now()
        mtime = os.stat(name).st_mtime
    except OSError as e:
        return [f"cannot write to the shared run directory {shared_dir} ({e.strerror or e})"]
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass
    if mtime < before - max_skew_s:
        skew, how = before - mtime, "ahead of"
    elif mtime > after + max_skew_s:
        skew, how = mtime - after, "behind"
    else:
        return []
    return [
        f"this node's clock is {skew:.1f} s off the shared filesystem's ({how} it); run chrony/NTP on the nodes "
        "(cross-node timings such as the TTFT breakdown would be wrong)"
    ]
