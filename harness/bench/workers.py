"""Load generation over several processes: one batch, N worker processes, one merged result.

One Python process streams some tens of thousands of tokens per second before its event
loop, not the server, sets the pace. `--workers N` starts N load processes (spawned,
so none inherits the parent's threads or event loop); each owns its share of the
concurrency as its own keep-alive connections (`Slot`s) for the whole sweep.

A batch keeps the single-process semantics exactly: requests are taken in order from one
counter in shared memory, by whichever slot of any worker is free, and each is sent once
its arrival offset (from one t0 on the system-wide monotonic clock, which
`time.perf_counter` reads on Linux) has passed; at most `concurrency` are in flight in
all. The request bytes are written once to a file that every worker maps. Each worker
sends back the `RequestOutput` of every request it ran (raw samples, not statistics), so
the parent merges them by index and computes exact percentiles as for one process.

Control: a pipe per worker carries ("batch", ...), ("stop", reason), ("drain", reason,
grace) and ("exit",); the worker answers each batch with its outputs and its load report (CPU time, event-loop
lag). A worker that dies fails the batch's unfinished requests with the reason and stops
the others; every worker is tracked by its PID, joined with a timeout and killed if it
does not exit. Workers ignore SIGINT: a Ctrl-C reaches the terminal's whole process group,
and what it does to a batch is the parent's to decide (it drains or stops the pool).
"""

from __future__ import annotations

import asyncio
import gc
import mmap
import multiprocessing as mp
import os
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from harness import aio
from harness.bench.client import RequestOutput, Slot, Target
from harness.bench.loadgen import LoadRun, Progress

# A worker that has not answered this long after its batch should have ended is killed.
ANSWER_GRACE_S = 30.0
START_TIMEOUT_S = 60.0
LAG_TICK_S = 0.02


def default_workers(concurrency: int) -> int:
    """One load process per 8 cores this process may run on, 1 to 16, at most `concurrency`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(16, cores // 8, concurrency))


def split(concurrency: int, workers: int) -> list[int]:
    """Slots per worker: as even as can be, the first ones take the remainder."""
    return [concurrency // workers + (k < concurrency % workers) for k in range(workers)]


@dataclass
class LoadReport:
    """How hard one load process worked during a batch: whether it, not the server, was
    the limit."""

    cpu_s: float = 0.0
    wall_s: float = 0.0
    lags_ms: list[float] = field(default_factory=list)  # lateness of a LAG_TICK_S timer

    @property
    def busy(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class LagMonitor:
    """Measures the event loop's lateness: a timer due every LAG_TICK_S records how late it
    fired. A loop busy parsing streams fires late; that lateness is added to every
    timestamp the client takes."""

    def __init__(self) -> None:
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            due = time.perf_counter() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            self.lags_ms.append(max(0.0, (time.perf_counter() - due) * 1000.0))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> list[float]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return self.lags_ms


# -- the worker process --------------------------------------------------------------------


def _worker_main(index: int, conn: Connection, counter: Any, counts: Any, url: str, chat: bool) -> None:
    """Entry point of a load process: serve batches until told to exit or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    aio.run(_Worker(index, conn, counter, counts, url, chat).serve())


class _Worker:
    def __init__(self, index: int, conn: Connection, counter: Any, counts: Any, url: str, chat: bool) -> None:
        self.index, self.conn, self.counter, self.counts = index, conn, counter, counts
        self.target = Target.from_url(url)
        self.chat = chat
        self.slots: list[Slot] = []
        self.run: LoadRun | None = None
        self.batch_id = -1  # the batch being run (or last run)
        # Stops and drains for batches not started yet, by batch id: (reason, grace or None).
        self.stops: dict[int, tuple[str, float | None]] = {}
        self.inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    def _readable(self) -> None:
        try:
            os.set_blocking(self.conn.fileno(), True)  # see _send
            msg = self.conn.recv()
        except (EOFError, OSError):
            msg = ("exit",)
        if msg[0] in ("stop", "drain"):
            # A stop or drain names its batch: one that comes before the batch has started acts
            # as it starts; one for a batch already answered is dropped.
            batch_id, reason, grace = msg[1], msg[2], (msg[3] if msg[0] == "drain" else None)
            if batch_id == self.batch_id and self.run is not None:
                _control(self.run, reason, grace)
            elif batch_id > self.batch_id:
                self.stops[batch_id] = (reason, grace)
        else:
            self.inbox.put_nowait(msg)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.conn.fileno(), self._readable)
        gc.collect()
        gc.freeze()  # what the imports made lives as long as the process: never walked again
        _send(self.conn, ("ready", os.getpid()))
        try:
            while True:
                msg = await self.inbox.get()
                if msg[0] == "exit":
                    return
                _, self.batch_id, path, bounds, limits, offsets, slots, timeout_s, t0, limit_s, limit_reason = msg
                answer = await self._batch(path, bounds, limits, offsets, slots, timeout_s, t0, limit_s, limit_reason)
                _send(self.conn, answer)
                del answer
                gc.collect()  # the batch's garbage, between batches
        finally:
            loop.remove_reader(self.conn.fileno())
            for s in self.slots:
                s.close()

    async def _batch(
        self,
        path: str,
        bounds: list[int],
        limits: list[int],
        offsets: list[float],
        slots: int,
        timeout_s: float,
        t0: float,
        limit_s: float | None,
        limit_reason: str | None,
    ) -> tuple[str, list[tuple[int, RequestOutput]], LoadReport]:
        n = len(bounds) - 1
        while len(self.slots) < slots:
            self.slots.append(Slot(self.target, self.chat))
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE) as data:
            requests = _Mapped(data, bounds)
            flags_at = bounds[-1]  # after the requests: a byte per request, set when it is sent
            # Each request's max_tokens, against which the client checks the server's usage.
            outs = [RequestOutput(0, limit) for limit in limits]
            taken: list[int] = []
            counter, counts, k = self.counter, self.counts, self.index

            def take() -> int:
                with counter.get_lock():
                    i = counter.value
                    counter.value = i + 1
                if i < n:
                    taken.append(i)
                return int(i)

            def sent(i: int) -> None:
                counts[3 * k + 2] += 1
                data[flags_at + i] = 1  # the parent's to read should this process die

            def finished(out: RequestOutput) -> None:
                counts[3 * k] += 1
                if not out.success:
                    counts[3 * k + 1] += 1

            run = LoadRun(self.target, self.chat, requests, outs, offsets, slots, timeout_s, slots=self.slots)
            run.take, run.on_sent, run.on_done = take, sent, finished
            self.run = run
            if (early := self.stops.pop(self.batch_id, None)) is not None:
                _control(run, *early)
            monitor = LagMonitor()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            # As the single-process batch (harness.bench.load_runner): no cyclic collection in the
            # middle of the timed requests, whose pause would be every request's lateness (the
            # collection is after the answer, off the clock).
            gc.disable()
            monitor.start()
            try:
                stopped = await run.run(limit_s, t0=t0, limit_reason=limit_reason) if slots else None
            finally:
                gc.enable()
                self.run = None
            lags = await monitor.stop()
            # A worker with no slot in this batch (fewer requests in flight than workers: C=1 on a
            # 16-core node) answers at once; its CPU over that millisecond would read as a process
            # 100 % busy, and the point as client-bound. It did no work: it reports none.
            report = (
                LoadReport(time.process_time() - cpu0, time.perf_counter() - wall0, lags) if slots else LoadReport()
            )
        # Requests this worker never took are the parent's to mark.
        return stopped or "", [(i, outs[i]) for i in taken], report


def _control(run: LoadRun, reason: str, grace_s: float | None) -> None:
    """A stop (grace None) or a drain of the worker's batch."""
    if grace_s is None:
        run.stop(reason)
    else:
        run.drain(reason, grace_s)


def _send(conn: Connection, msg: Any) -> None:
    """Send on a pipe the event loop also watches: uvloop's add_reader makes the descriptor
    non-blocking, and a Connection cannot send or receive a message larger than the pipe's
    buffer without blocking, so it is made blocking again around each message (a message,
    once its first byte is there, arrives whole and promptly)."""
    os.set_blocking(conn.fileno(), True)
    conn.send(msg)


class _Mapped(Sequence[bytes]):
    """Request i of the batch file, read from the shared map when it is sent."""

    def __init__(self, data: mmap.mmap, bounds: list[int]) -> None:
        self.data, self.bounds = data, bounds

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, i: int) -> bytes:  # type: ignore[override]  # ints only
        return self.data[self.bounds[i] : self.bounds[i + 1]]


# -- the parent's side ---------------------------------------------------------------------


@dataclass
class _Proc:
    process: Any  # multiprocessing.context.SpawnProcess
    conn: Connection
    pid: int = 0


class WorkerPool:
    """N load processes for one sweep: start(), run batches, close()."""

    def __init__(self, workers: int, url: str, chat: bool) -> None:
        self.n = workers
        self.url, self.chat = url, chat
        self._ctx = mp.get_context("spawn")
        self._counter = self._ctx.Value("q", 0)
        self._counts = self._ctx.Array("q", 3 * workers, lock=False)  # done, failed, sent per worker
        self._procs: list[_Proc] = []
        self._stop_reason: str | None = None
        self._drain_reason: str | None = None
        self._batch_id = 0
        self.broken: str | None = None  # why a worker is gone: no further batch can run

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    async def start(self) -> None:
        for k in range(self.n):
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(
                target=_worker_main,
                args=(k, child, self._counter, self._counts, self.url, self.chat),
                name=f"pdbench-load-{k}",
                daemon=True,  # never outlives the parent, whatever happens to it
            )
            proc.start()
            child.close()
            self._procs.append(_Proc(proc, parent))
        for p in self._procs:
            msg = await self._recv(p, START_TIMEOUT_S)
            if msg is None or msg[0] != "ready":
                await self.close()
                raise RuntimeError(f"load worker {p.process.name} did not start: {msg}")
            p.pid = msg[1]

    async def _recv(self, p: _Proc, timeout_s: float) -> Any:
        """The next message from a worker; None if it died or did not answer in time."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def readable() -> None:
            if fut.done():
                return
            try:
                os.set_blocking(p.conn.fileno(), True)  # see _send
                fut.set_result(p.conn.recv())
            except (EOFError, OSError):
                fut.set_result(None)

        loop.add_reader(p.conn.fileno(), readable)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            return None
        finally:
            loop.remove_reader(p.conn.fileno())

    def progress_of(self, progress: Progress) -> None:
        """Copy the workers' counters into `progress` (for the display)."""
        c = self._counts
        progress.done = sum(c[0::3])
        progress.failed = sum(c[1::3])
        progress.sent = sum(c[2::3])

    async def run_batch(
        self,
        requests: Sequence[bytes],
        outs: list[RequestOutput],
        offsets: Sequence[float],
        concurrency: int,
        timeout_s: float,
        progress: Progress,
        limit_s: float | None,
        limit_reason: str | None,
    ) -> tuple[str | None, list[LoadReport]]:
        """Run one batch over the workers, fill `outs`; (why it stopped early or None, the
        workers' load reports)."""
        n = len(requests)
        progress.total = n
        if self.broken is not None:
            for o in outs:
                o.error = self.broken
            return self.broken, []
        self._stop_reason = self._drain_reason = None
        self._batch_id += 1
        self._counter.value = 0
        for i in range(len(self._counts)):
            self._counts[i] = 0
        fd, path = tempfile.mkstemp(prefix="pdbench-batch-", dir=_spill_dir(sum(len(r) for r in requests)))
        bounds = [0]
        try:
            with os.fdopen(fd, "wb") as f:
                for r in requests:
                    f.write(r)
                    bounds.append(bounds[-1] + len(r))
                f.write(bytes(n))  # the sent flags (_Worker._batch)
            slots = split(max(1, min(concurrency, n)), self.n)
            # Every worker has the batch and is ready before offset 0: on a loaded machine that
            # took up to ~200 ms (a trace's first requests were that late with 50 ms).
            t0 = time.perf_counter() + 0.25
            offs = [float(x) for x in offsets]
            limits = [o.expected_output_len for o in outs]
            for p, s in zip(self._procs, slots, strict=True):
                msg = ("batch", self._batch_id, path, bounds, limits, offs, s, timeout_s, t0, limit_s, limit_reason)
                _send(p.conn, msg)
            answer_s = (limit_s if limit_s is not None else 1e9) + ANSWER_GRACE_S
            poller = asyncio.get_running_loop().create_task(self._poll(progress))
            try:
                answers = await asyncio.gather(*(self._answer(k, answer_s) for k in range(self.n)))
            finally:
                poller.cancel()
            # A load process that died took its requests' measurements with it, but not the
            # flags of those it sent: those were sent (and failed), the rest were not.
            sent_flags = _read_at(path, bounds[-1], n) if None in answers else bytes(n)
        finally:
            os.unlink(path)
        reports: list[LoadReport] = []
        reasons: list[str] = []
        seen: set[int] = set()
        for answer in answers:
            if answer is None:
                continue
            stopped, results, report = answer
            if stopped:
                reasons.append(stopped)
            reports.append(report)
            for i, out in results:
                _merge(outs[i], out)
                seen.add(i)
        self.progress_of(progress)
        reason = self._drain_reason or self._stop_reason or (reasons[0] if reasons else None)
        if reason is not None:
            for i, o in enumerate(outs):
                if i not in seen or (not o.success and not o.error):
                    o.error = o.error or reason
                o.lost = i not in seen and sent_flags[i] == 1
        return reason, reports

    async def _answer(self, k: int, timeout_s: float) -> Any:
        """Worker k's answer to the batch; if it died or went silent, the others are stopped
        at once (the batch is then incomplete) and the pool is broken for later batches."""
        answer = await self._recv(self._procs[k], timeout_s)
        if answer is None:
            proc = self._procs[k]
            proc.process.join(1.0)  # an EOF on its pipe: it is exiting, reap it to say how
            how = "did not answer" if proc.process.is_alive() else f"exited with {proc.process.exitcode}"
            self.broken = self.broken or f"load worker {k} (pid {proc.pid}) {how}"
            self.stop(self.broken)
        return answer

    async def _poll(self, progress: Progress) -> None:
        while True:
            self.progress_of(progress)
            await asyncio.sleep(0.2)

    def stop(self, reason: str) -> None:
        """End the running batch in every worker (their unfinished requests fail with `reason`)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        for p in self._procs:
            try:
                _send(p.conn, ("stop", self._batch_id, reason))
            except OSError:
                pass

    def drain(self, reason: str, grace_s: float) -> None:
        """Every worker sends no more of the running batch and lets its requests in flight finish
        for `grace_s` (then they fail); the batch ends with `reason`."""
        if self._stop_reason is not None or self._drain_reason is not None:
            return
        self._drain_reason = reason
        for p in self._procs:
            try:
                _send(p.conn, ("drain", self._batch_id, reason, grace_s))
            except OSError:
                pass

    async def close(self) -> None:
        """Ask every worker to exit, then join it; one that does not exit in 10 s is killed."""
        for p in self._procs:
            try:
                _send(p.conn, ("exit",))
            except OSError:
                pass
        deadline = time.monotonic() + 10.0
        for p in self._procs:
            while p.process.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if p.process.is_alive():
                p.process.kill()
            p.process.join(5)
            p.conn.close()
        self._procs = []


def _read_at(path: str, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def _merge(into: RequestOutput, out: RequestOutput) -> None:
    """A worker's measurement of a request, into the parent's output (which keeps the
    prompt and output lengths the parent sampled)."""
    into.success, into.output_tokens, into.ttft, into.itl = out.success, out.output_tokens, out.ttft, out.itl
    into.latency, into.start_time, into.end_time = out.latency, out.start_time, out.end_time
    into.error, into.queue_time = out.error, out.queue_time


def _spill_dir(size: int) -> str | None:
    """Batch files go to /dev/shm (memory) when it has room for them twice over; a
    container's /dev/shm is often only 64 MiB, then the system's temp directory."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if st.f_bavail * st.f_frsize > 2 * size and os.access("/dev/shm", os.W_OK) else None
