"""When a sweep stops sending, each stop rule apart: the target died (the watchdog), a Ctrl-C, the
sweep's total timeout, a point whose evidence is already bad (validity.early_check_s), every
warm-up failed, results that cannot be written.

A rule that fires stops the running batch (Stops.current) now or after a drain, and the points
left are not run (why_not_run). A first Ctrl-C (SIGINT) sends no more requests, waits at most
`interrupt_grace_s` for those in flight, ends a cooldown or the setup, bounds a profiler's stop;
a second one cancels the requests in flight at once.
"""

from __future__ import annotations

import asyncio
import math
import signal
import time
from typing import Any, Protocol

from harness.bench.client_config import ClientConfig
from harness.bench.loadgen import Progress
from harness.bench.profile import PointProfiler
from harness.bench.progress import log
from harness.bench.sentinels import PointSentinels

INTERRUPTED = "interrupted by SIGINT (Ctrl-C)"
WARMUPS_FAILED = "every warm-up request failed, so no measured request was sent"
# After a first Ctrl-C a profiled window's traces are waited for this long at most, not
# stop_timeout_s (600 s by default, sized for a CPU trace of a long window): the user asked to
# stop, and a trace that is not written by then is given up (the section names the servers
# whose traces came). 30 s covers /stop_profile and a short window's torch trace; an nsys stream
# of a GPU window (about 2 min for 2 GB on an H200) is given up, as the stop asked.
INTERRUPT_PROFILE_STOP_S = 30.0
# A SIGINT this soon after the first is the same Ctrl-C delivered again: `timeout` and other
# wrappers pass on the one their process group got from the terminal (coreutils' timeout to
# the child and then to its group: three in all), while a person's second Ctrl-C takes longer.
SAME_CTRL_C_S = 0.5


class Batch(Protocol):
    """A running batch of requests (loadgen.LoadRun, sessions.SessionRun, workers.WorkerPool)."""

    def stop(self, reason: str) -> None: ...

    def drain(self, reason: str, grace_s: float) -> None: ...


class Stops:
    def __init__(self, cfg: ClientConfig) -> None:
        self.cfg = cfg
        self.dead: str | None = None  # why the target is considered dead (or the sweep must stop)
        self.interrupted: str | None = None  # set by a first Ctrl-C
        self.interrupts = 0
        self.first_interrupt_at = 0.0
        self.halt = asyncio.Event()  # set by a first Ctrl-C: ends a cooldown and the waits it bounds
        self.deadline = math.inf  # perf_counter bound of the whole sweep
        # What a stop acts on, each set while it runs.
        self.current: Batch | None = None  # the running batch
        self.progress = Progress()  # the running batch's counters
        self.point_sentinels: PointSentinels | None = None  # the running point's, which a Ctrl-C cancels
        self.profiling: PointProfiler | None = None  # the started profiler, whose stop a Ctrl-C bounds
        self.setup: asyncio.Task[None] | None = None  # the work before the first point
        self.main: asyncio.Task[Any] | None = None  # the sweep, cancelled by a second Ctrl-C between batches

    # -- the rules --------------------------------------------------------------

    def on_dead(self, reason: str) -> None:
        """The target died (or a load process broke): the running batch stops now, no point is run after it."""
        self.dead = reason
        log(f"stopping now: {reason}")
        if self.current is not None:
            self.current.stop(reason)

    def on_interrupt(self) -> None:
        """SIGINT: the first drains the running batch (or ends the setup), the second cancels now."""
        if self.interrupts == 1 and time.monotonic() - self.first_interrupt_at < SAME_CTRL_C_S:
            return
        self.interrupts += 1
        if self.interrupts == 1:
            self.first_interrupt_at = time.monotonic()
            self.interrupted = INTERRUPTED
            self.halt.set()
            if self.point_sentinels is not None:
                self.point_sentinels.cancel()
            if self.profiling is not None:
                self.profiling.hurry(INTERRUPT_PROFILE_STOP_S, INTERRUPTED)
            if self.current is not None:
                grace = self.cfg.interrupt_grace_s
                n = self.progress.in_flight
                log(
                    f"Ctrl-C: sending stopped; waiting up to {grace:g} s for {n} request(s) in flight, "
                    "then the points left are skipped (Ctrl-C again to stop now)"
                )
                self.progress.note = "stopping (Ctrl-C)"
                self.current.drain(INTERRUPTED, grace)
            else:
                log("Ctrl-C: stopping; the points left are skipped (Ctrl-C again to stop now)")
                if self.setup is not None:
                    self.setup.cancel()
            return
        # A third Ctrl-C is Python's: KeyboardInterrupt.
        asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
        if self.current is not None:
            log(f"second Ctrl-C: cancelling {self.progress.in_flight} request(s) in flight now")
            self.progress.note = "cancelled (second Ctrl-C)"
            self.current.stop(f"{INTERRUPTED}: cancelled in flight by a second Ctrl-C")
        elif self.setup is not None:
            log("second Ctrl-C: stopping now")
            self.setup.cancel()
        elif self.main is not None:
            # Between batches (a point's sentinels, its last scrapes): nothing left to cut short.
            log("second Ctrl-C: stopping now; the point being finished is not written")
            self.main.cancel()

    def on_invalid(self, label: str, concurrency: int, why: str) -> None:
        """A point whose evidence is already bad stops now (validity.early_check_s)."""
        log(f"{label}: stopping the point: {why}")
        if self.cfg.validity.on_early_invalid == "stop_sweep":
            self.dead = f"validity.on_early_invalid=stop_sweep after C={concurrency}: {why}"
        if self.current is not None:
            self.current.stop(f"invalid point: {why}")

    def on_warmups_failed(self, why: str) -> None:
        """Every warm-up failed: the measured requests and the points left would fail the same way."""
        self.dead = why

    def on_unwritable(self, why: str) -> None:
        """A result could not be written: the next points' could not be either."""
        self.dead = f"results cannot be written ({why})"

    def start_clock(self) -> None:
        """The sweep's total bound counts from now."""
        if self.cfg.total_timeout_s is not None:
            self.deadline = time.perf_counter() + self.cfg.total_timeout_s

    def now_profiling(self, profiler: PointProfiler | None) -> None:
        """The profiler started now (None: stopped), whose stop a first Ctrl-C bounds; one
        started after that Ctrl-C is bounded at once."""
        self.profiling = profiler
        if profiler is not None and self.interrupted is not None:
            profiler.hurry(INTERRUPT_PROFILE_STOP_S, self.interrupted)

    # -- what they say ------------------------------------------------------------

    def total_reason(self) -> str:
        return f"total timeout: the sweep ran past total_timeout_s={self.cfg.total_timeout_s:g}"

    def halted(self) -> str | None:
        """Why no batch may start (the target died, Ctrl-C); None while one may."""
        return self.dead or self.interrupted

    def limit(self, point_limit: float) -> tuple[float, str | None]:
        """A batch's time bound and, when the sweep's bound is the tighter, its reason."""
        left = self.deadline - time.perf_counter()
        if left < point_limit:
            return max(0.0, left), self.total_reason()
        return point_limit, None

    def stopped(self) -> str | None:
        """Why the sweep runs no more points (the target died, Ctrl-C, the total timeout); None while it may."""
        if self.dead is not None or self.interrupted is not None:
            return self.dead or self.interrupted
        return self.total_reason() if time.perf_counter() >= self.deadline else None

    def ends_point(self, stopped: str) -> bool:
        """Whether a batch's stop ends its whole point (not only the batch: its own time bound)."""
        return self.dead is not None or self.interrupted is not None or stopped == self.total_reason()
