"""Notice at once when the benchmark's target dies, so a sweep stops instead of timing out.

Two independent signals:
- `<base_url>/health`, polled every `interval_s`: a refused connection means nothing
  listens any more (dead at once); a 5xx answer or no answer within the check's
  timeout, three times in a row, means dead (a loaded server may miss some); 404/405 means
  the endpoint has no health route, and checks stop with a notice;
- server PIDs on this machine (`server_pids`), polled every 0.25 s: one that exited
  (or is a zombie) means dead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import aiohttp
import psutil

PID_POLL_S = 0.25
FAILURES_TO_DEAD = 3


class TargetDied(Exception):
    """The target cannot serve any more; the message says what was seen."""


def pid_gone(pid: int) -> str | None:
    """Why `pid` no longer runs, or None while it does."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return f"server process {pid} exited (zombie)"
    except psutil.NoSuchProcess:
        return f"server process {pid} exited"
    except psutil.Error:
        return None  # e.g. access denied: it exists
    return None


async def check_health(session: aiohttp.ClientSession, url: str, timeout_s: float) -> tuple[str, str]:
    """One /health poll: ("ok" | "refused" | "bad" | "absent", detail)."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            await resp.read()
            if resp.status in (404, 405):
                return "absent", f"HTTP {resp.status}"
            if resp.status >= 500:
                return "bad", f"HTTP {resp.status} {resp.reason}"
            return "ok", f"HTTP {resp.status}"
    except aiohttp.ClientConnectorError as e:
        return "refused", f"cannot connect: {e}"
    except asyncio.TimeoutError:
        return "bad", f"no answer within {timeout_s:g} s"
    except aiohttp.ClientError as e:
        return "bad", f"{type(e).__name__}: {e}"


class Watchdog:
    """Run `watch()` as a task; it calls `on_dead(reason)` once and returns when the target dies."""

    def __init__(
        self,
        base_url: str,
        interval_s: float,
        server_pids: Sequence[int],
        on_dead: Callable[[str], None],
        log: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.health_url = base_url.rstrip("/") + "/health"
        self.interval_s = interval_s
        self.pids = list(server_pids)
        self.on_dead = on_dead
        self.log = log
        self.dead: str | None = None
        self._health_on = interval_s > 0

    def _died(self, reason: str) -> None:
        if self.dead is None:
            self.dead = reason
            self.on_dead(reason)

    async def preflight(self, session: aiohttp.ClientSession) -> None:
        """Before any load: raise TargetDied if a PID is gone or the target refuses connections."""
        for pid in self.pids:
            if (why := pid_gone(pid)) is not None:
                raise TargetDied(why)
        if not self._health_on:
            return
        state, detail = await check_health(session, self.health_url, self._timeout())
        if state == "refused":
            raise TargetDied(f"target is not reachable: {self.health_url}: {detail}")
        if state == "absent":
            self.log(f"{self.health_url} answered {detail}: no health checks against this target")
            self._health_on = False
        elif state == "bad":
            self.log(f"{self.health_url} is not healthy yet ({detail}); going on")

    def _timeout(self) -> float:
        return max(5.0, self.interval_s)

    async def watch(self, session: aiohttp.ClientSession) -> None:
        tasks = []
        if self.pids:
            tasks.append(asyncio.create_task(self._watch_pids()))
        if self._health_on:
            tasks.append(asyncio.create_task(self._watch_health(session)))
        if not tasks:
            return
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch_pids(self) -> None:
        while True:
            for pid in self.pids:
                if (why := pid_gone(pid)) is not None:
                    self._died(why)
                    return
            await asyncio.sleep(PID_POLL_S)

    async def _watch_health(self, session: aiohttp.ClientSession) -> None:
        failures = 0
        while True:
            await asyncio.sleep(self.interval_s)
            state, detail = await check_health(session, self.health_url, self._timeout())
            if state == "refused":
                self._died(f"target died: {self.health_url}: {detail}")
                return
            if state == "absent":
                return
            failures = failures + 1 if state == "bad" else 0
            if failures >= FAILURES_TO_DEAD:
                self._died(f"target died: {self.health_url}: {detail} ({failures} checks in a row)")
                return
