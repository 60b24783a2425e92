"""The load generator: send a batch of prepared requests with arrival times and a concurrency cap.

`concurrency` workers each own one connection (a `Slot`) and take the requests in
order. A worker sends the next request once it has arrived (its arrival offset has
passed) and the worker is free, which is vLLM's order too: arrival first, then wait
for one of the `--max-concurrency` slots, first come first served.

`stop(reason)` ends a batch at once: the requests in flight fail with `reason`, those
never sent fail with it too (with no start time), and the finished ones are kept.
`drain(reason, grace_s)` sends no more but lets the requests in flight finish, for at most
`grace_s`; then it stops the batch as `stop` does (a first Ctrl-C).

A worker waits for an arrival time on the batch's `SendClock`, not on a timer of its own: the
event loop's timers are coarse (uvloop rounds them to the millisecond and fires up to ~1.4 ms
early; asyncio's selector rounds up, ~0.7 ms late at the median), and a trace replay keeps to
its schedule (harness.bench.trace reports each point's lateness).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.bench.client import RequestOutput, Slot, Target


def arrival_offsets(n: int, rate: float, rng: np.random.Generator, burstiness: float = 1.0) -> np.ndarray:
    """Send times (s from start): all at once for rate inf, else gamma-distributed gaps.

    As vLLM's `get_request`: gaps ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)),
    so burstiness 1 is a Poisson process, < 1 burstier, > 1 more regular, inf evenly
    spaced; the cumulative times are rescaled to end at n/rate so the achieved rate does
    not drift with the seed.
    """
    if math.isinf(rate) or n == 0:
        return np.zeros(n)
    if math.isinf(burstiness):
        t = np.arange(1, n + 1) / rate
    else:
        t = np.cumsum(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n))
    return t * (n / rate) / t[-1]


class SendClock:
    """Wakes each waiter at its due time (perf_counter), never before it, to within the
    operating system's wake-up latency: a thread sleeps on a condition variable (nanosleep's
    precision) until the earliest due time, then hands the loop every waiter then due. A
    sleeping thread costs no CPU and, being a sleeper, is woken promptly on a loaded machine,
    where an event loop spinning to the due time would be descheduled."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    async def until(self, due: float) -> None:
        fut = self._loop.create_future()
        with self._cv:
            heapq.heappush(self._heap, (due, next(self._seq), fut))
            if self._heap[0][2] is fut:
                self._cv.notify()  # earlier than the thread sleeps for
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pdbench-send-clock", daemon=True)
                self._thread.start()
        await fut

    def _run(self) -> None:
        heap = self._heap
        with self._cv:
            while not self._closed:
                wait = heap[0][0] - time.perf_counter() if heap else None
                if wait is None or wait > 0:
                    self._cv.wait(wait)
                    continue
                now = time.perf_counter()
                due: list[asyncio.Future[None]] = []
                while heap and heap[0][0] <= now:
                    due.append(heapq.heappop(heap)[2])
                try:
                    self._loop.call_soon_threadsafe(_wake, due)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    return

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(5.0)


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():  # a cancelled waiter (a drain)
            fut.set_result(None)


async def run_workers(
    tasks: list[asyncio.Task[Any]], stopped: asyncio.Event, limit_s: float | None, on_limit: Callable[[], None]
) -> None:
    """Wait for a batch's worker tasks until they all end, `stopped` is set, or limit_s passes
    (then on_limit() stops the batch); cancel those still running and wait for them."""
    everything = asyncio.gather(*tasks)
    stopper = asyncio.create_task(stopped.wait())
    try:
        waiters: list[asyncio.Future[Any]] = [everything, stopper]
        await asyncio.wait(waiters, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
        if not everything.done():
            if not stopped.is_set():  # the time ran out, nothing stopped the batch before
                on_limit()
            for t in tasks:
                t.cancel()
        await asyncio.gather(everything, return_exceptions=True)
    finally:
        stopper.cancel()


@dataclass
class Progress:
    """Counters a display can poll; the load generator only increments them."""

    total: int = 0
    done: int = 0
    failed: int = 0
    sent: int = 0
    note: str = ""  # what the display says besides the counts (e.g. that the batch is stopping)

    @property
    def in_flight(self) -> int:
        return max(0, self.sent - self.done)


class LoadRun:
    def __init__(
        self,
        url: str | Target,
        chat: bool,
        requests: Sequence[bytes],
        outs: Sequence[RequestOutput],
        offsets: Sequence[float],
        concurrency: int,
        request_timeout_s: float,
        progress: Progress | None = None,
        slots: Sequence[Slot] | None = None,
    ) -> None:
        """`slots`: connections to reuse (e.g. warm from the warmups), at least `concurrency`
        of them; the caller then closes them. Without, the batch opens and closes its own."""
        self.target = url if isinstance(url, Target) else Target.from_url(url)
        self.chat = chat
        self.requests = requests
        self.outs = outs
        self.offsets = [float(x) for x in offsets]
        self.concurrency = max(1, min(concurrency, len(requests))) if requests else 0
        self.request_timeout_s = request_timeout_s
        self.progress = progress or Progress()
        self.progress.total = len(requests)
        self.stop_reason: str | None = None
        self.drain_reason: str | None = None
        self._grace: asyncio.TimerHandle | None = None
        self._waiting: set[asyncio.Task[None]] = set()  # workers waiting for their next arrival time
        self._next = 0
        self._own_slots = slots is None
        self._slots: list[Slot] = list(slots[: self.concurrency]) if slots is not None else []
        self._stopped: asyncio.Event | None = None
        self._clock: SendClock | None = None
        self.t0 = 0.0
        # Several load processes share one request counter (harness.bench.workers): `take`
        # then hands out the next index, `on_sent` sees each request leave, `on_done` each
        # finished one.
        self.take: Callable[[], int] | None = None
        self.on_sent: Callable[[int], None] | None = None
        self.on_done: Callable[[RequestOutput], None] | None = None

    def _take(self) -> int:
        i = self._next
        self._next = i + 1
        return i

    async def _worker(self, slot: Slot) -> None:
        n, outs, reqs, offsets, progress = len(self.requests), self.outs, self.requests, self.offsets, self.progress
        timeout, t0 = self.request_timeout_s, self.t0
        take, on_sent, on_done = self.take or self._take, self.on_sent, self.on_done
        me = asyncio.current_task()
        assert me is not None and self._clock is not None
        clock = self._clock
        while self.stop_reason is None and self.drain_reason is None:
            i = take()
            if i >= n:
                return
            due = t0 + offsets[i]
            if due > time.perf_counter():
                self._waiting.add(me)
                try:
                    await clock.until(due)
                except asyncio.CancelledError:
                    if self.drain_reason is None:
                        raise
                    return  # woken by drain: request i is never sent
                finally:
                    self._waiting.discard(me)
                if self.stop_reason is not None or self.drain_reason is not None:
                    return
            out = outs[i]
            out.queue_time = max(0.0, time.perf_counter() - due)
            progress.sent += 1
            if on_sent is not None:
                on_sent(i)
            await slot.send(reqs[i], out, timeout)
            progress.done += 1
            if not out.success:
                progress.failed += 1
            if on_done is not None:
                on_done(out)

    async def run(
        self, limit_s: float | None = None, t0: float | None = None, limit_reason: str | None = None
    ) -> str | None:
        """Send every request; returns None, or why the batch stopped early.

        `limit_s` bounds the batch (`limit_reason` is then the failed requests' error);
        `t0` (perf_counter) is when arrival offset 0 is, default now.
        """
        self._stopped = asyncio.Event()
        self._clock = SendClock(asyncio.get_running_loop())
        self.t0 = time.perf_counter() if t0 is None else t0
        if self._own_slots:
            self._slots = [Slot(self.target, self.chat) for _ in range(self.concurrency)]
        elif len(self._slots) < self.concurrency:
            raise ValueError(f"{len(self._slots)} slots for concurrency {self.concurrency}")
        tasks = [asyncio.create_task(self._worker(s)) for s in self._slots]
        if not tasks:
            return None
        try:
            await run_workers(
                tasks,
                self._stopped,
                limit_s,
                lambda: self.stop(limit_reason or f"point timeout: unfinished after {limit_s:g}s"),
            )
        finally:
            self._clock.close()
            if self._grace is not None:
                self._grace.cancel()
            if self._own_slots:
                for s in self._slots:
                    s.close()
        reason = self.drain_reason or self.stop_reason
        if reason is not None:
            for o in self.outs:
                if not o.success and not o.error:
                    o.error = reason
        return reason

    def drain(self, reason: str, grace_s: float) -> None:
        """Send no more requests; those in flight may finish for `grace_s`, then the batch is
        stopped (they fail with `reason` and the grace). The batch ends with `reason`."""
        if self.stop_reason is not None or self.drain_reason is not None:
            return
        self.drain_reason = reason
        for t in list(self._waiting):
            t.cancel()
        loop = asyncio.get_running_loop()
        self._grace = loop.call_later(
            grace_s, self.stop, f"{reason}: still in flight after the {grace_s:g} s grace, cancelled"
        )

    def stop(self, reason: str) -> None:
        """End the batch now; safe to call from the event loop at any time, more than once."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        for s in self._slots:
            s.abort(reason)
        if self._stopped is not None:
            self._stopped.set()
