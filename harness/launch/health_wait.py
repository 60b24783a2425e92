"""Progress through a job's health wait (10-20 minutes on GPU clusters), read from its logs.

The nodes log "<name> is healthy" for each server and the proxy as it gets ready, "node N:
phase P" as a later phase starts, and node 0 "every server and the proxy are ready" once a
phase's whole job is (harness.node.runtime). Until then a line every so often says how long
the phase's wait has lasted, who is ready, who is not, and the last line of a waiting server's
own log (vLLM loading weights, compiling, ...). Each phase (the disaggregated servers, then an
aggregated baseline's) has a wait of its own.
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
        self.start: float | None = None  # when the running phase's wait began (the first pump for the first)
        self.next_at = 0.0
        self.ready_phases = 0  # phases whose whole job is ready, in plan order
        self.healthy: set[str] = set()
        self.offsets: dict[str, int] = {}

    @property
    def ready(self) -> bool:
        """Every phase's wait is over (or the plan cannot be read: nothing to follow)."""
        phases = self._phases()
        return not phases or self.ready_phases >= len(phases)

    def _phases(self) -> list[tuple[str | None, list[str]]]:
        """Each phase's servers and proxies (the ones its health wait gates), in the order they run."""
        try:
            procs = self.run.read_plan()["processes"]
        except (OSError, ValueError, KeyError):
            return []
        phases: dict[str | None, list[str]] = {}
        for p in procs:
            if p.get("kind") in ("server", "proxy"):
                phases.setdefault(p.get("phase"), []).append(p["name"])
        return list(phases.items())

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
                    self.ready_phases += 1
                    # The next phase's wait starts when its servers do, after this phase's benchmark.
                    self.start = None

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
        """Say where the running phase's wait stands, when it is time to; nothing while a phase's
        job is ready and the next has not begun. Call it while the job runs (not while it is queued)."""
        self._read_node_logs()
        if self.ready:
            return
        phases = self._phases()
        _, gated = phases[self.ready_phases]
        waiting = [n for n in gated if n not in self.healthy]
        if self.start is None:
            if self.ready_phases and len(waiting) == len(gated) and not self._started(gated):
                return  # the previous phase's benchmark is still running
            self.start = time.monotonic()
            self.next_at = self.start + self.first_s
        if time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        if not waiting:
            return
        elapsed = int(time.monotonic() - self.start)
        label = f" ({phases[self.ready_phases][0]})" if len(phases) > 1 else ""
        text = (
            f"health wait{label} {elapsed // 60}:{elapsed % 60:02d}: {len(gated) - len(waiting)} of {len(gated)} "
            f"ready; waiting for {', '.join(waiting)}"
        )
        last = self._last_line(waiting[0])
        if last is not None:
            text += f"\n  {waiting[0]}: {last}"
        self.out.write(text + "\n")
        self.out.flush()

    def _started(self, names: list[str]) -> bool:
        """Whether any of these processes has a log yet: its phase has begun."""
        return any(self.run.log(n).exists() for n in names)
