"""Progress through a job's health wait (10-20 minutes on GPU clusters), read from its logs.

The nodes log "<name> is healthy" for each server and the proxy as it gets ready, and node 0
"every server and the proxy are ready" once the whole job is (harness.node.runtime). Until
then a line every so often says how long the wait has lasted, who is ready, who is not, and
the last line of a waiting server's own log (vLLM loading weights, compiling, ...).
"""

from __future__ import annotations

import time
from typing import TextIO

from harness.rundir import RunDir

READY = "every server and the proxy are ready"
LINE_MAX = 160  # a waiting server's log line is cut here: one screen line or two


class HealthWait:
    def __init__(self, run: RunDir, out: TextIO, first_s: float = 10.0, every_s: float = 30.0):
        self.run = run
        self.out = out
        self.first_s, self.every_s = first_s, every_s
        self.start: float | None = None  # the first pump: the caller pumps once the job runs
        self.next_at = 0.0
        self.ready = False
        self.healthy: set[str] = set()
        self.offsets: dict[str, int] = {}

    def _gated(self) -> list[str]:
        """The servers and proxies of the job's first phase, the ones its first health wait gates."""
        try:
            procs = self.run.read_plan()["processes"]
        except (OSError, ValueError, KeyError):
            return []
        gated = [p for p in procs if p.get("kind") in ("server", "proxy")]
        first = gated[0].get("phase") if gated else None
        return [p["name"] for p in gated if p.get("phase") == first]

    def _read_node_logs(self) -> None:
        for path in sorted(self.run.logs.glob("node*.log")):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path.name, 0))
                    data = f.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1
            self.offsets[path.name] = self.offsets.get(path.name, 0) + cut
            for line in data[:cut].decode(errors="replace").splitlines():
                if line.endswith(" is healthy"):
                    self.healthy.add(line.rsplit(" ", 3)[-3])
                elif line.endswith(READY):
                    self.ready = True

    def _last_line(self, name: str) -> str | None:
        try:
            with open(self.run.log(name), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 4096))
                lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return None
        if not lines:
            return None
        last = lines[-1]
        return last if len(last) <= LINE_MAX else last[: LINE_MAX - 3] + "..."

    def pump(self) -> None:
        """Say where the wait stands, when it is time to; nothing once the job is ready.
        Call it while the job runs (not while it is queued)."""
        if self.start is None:
            self.start = time.monotonic()
            self.next_at = self.start + self.first_s
        if self.ready or time.monotonic() < self.next_at:
            return
        self._read_node_logs()
        if self.ready:
            return
        self.next_at = time.monotonic() + self.every_s
        gated = self._gated()
        waiting = [n for n in gated if n not in self.healthy]
        if not gated or not waiting:
            return
        elapsed = int(time.monotonic() - self.start)
        text = (
            f"health wait {elapsed // 60}:{elapsed % 60:02d}: {len(gated) - len(waiting)} of {len(gated)} ready; "
            f"waiting for {', '.join(waiting)}"
        )
        last = self._last_line(waiting[0])
        if last is not None:
            text += f"\n  {waiting[0]}: {last}"
        self.out.write(text + "\n")
        self.out.flush()
