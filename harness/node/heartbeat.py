"""The host's heartbeat, for a node runtime inside a container.

A container runs outside Slurm's process tracking: when Slurm kills a node's task (scancel
past KillWait, a lost node), the container itself lives on. The per-node container wrapper
(container.sh on the host) touches a file every few seconds while its task lives; the node
runtime inside the container watches it and tears down once it stops, so no container
outlives its job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

# The wrapper beats every 2 s; a busy 2-core host can stall it for a few seconds.
STALE_AFTER_S = 20.0
# A stale beat is believed only once it stays unchanged this long by the watcher's own clock:
# when the whole host stalls (a CI job once starved every process of a 2-core machine for over
# 20 s), the watcher wakes to a stale file that the wrapper touches again within its 2 s beat.
CONFIRM_S = 10.0


class HostHeartbeat:
    def __init__(
        self,
        path: Path | None,
        stale_after_s: float = STALE_AFTER_S,
        confirm_s: float = CONFIRM_S,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.path, self.stale_after_s, self.confirm_s = path, stale_after_s, confirm_s
        self._monotonic = monotonic
        self._stale_seen: tuple[float, float] | None = None  # (mtime, when first seen stale)

    @classmethod
    def from_env(cls) -> HostHeartbeat:
        path = os.environ.get("PDBENCH_HEARTBEAT")
        return cls(Path(path) if path else None)

    def lost(self) -> str | None:
        """Why the host side is gone, or None while it beats (or where nothing beats)."""
        if self.path is None:
            return None
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return f"the container's host-side wrapper is gone ({self.path} was removed)"
        age = time.time() - mtime
        if age <= self.stale_after_s:
            self._stale_seen = None
            return None
        now = self._monotonic()
        if self._stale_seen is None or self._stale_seen[0] != mtime:
            self._stale_seen = (mtime, now)
        if now - self._stale_seen[1] < self.confirm_s:
            return None
        return (
            f"the container's host-side wrapper stopped beating {age:.0f} s ago "
            "(its Slurm task was killed or the node was lost)"
        )
