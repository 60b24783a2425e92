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
from pathlib import Path

# The wrapper beats every 2 s; a busy 2-core host can stall it for a few seconds.
STALE_AFTER_S = 20.0


class HostHeartbeat:
    def __init__(self, path: Path | None, stale_after_s: float = STALE_AFTER_S):
        self.path, self.stale_after_s = path, stale_after_s

    @classmethod
    def from_env(cls) -> HostHeartbeat:
        path = os.environ.get("PDBENCH_HEARTBEAT")
        return cls(Path(path) if path else None)

    def lost(self) -> str | None:
        """Why the host side is gone, or None while it beats (or where nothing beats)."""
        if self.path is None:
            return None
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return f"the container's host-side wrapper is gone ({self.path} was removed)"
        if age > self.stale_after_s:
            return (
                f"the container's host-side wrapper stopped beating {age:.0f} s ago "
                "(its Slurm task was killed or the node was lost)"
            )
        return None
