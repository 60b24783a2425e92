"""Send a window of requests and time it: the sweep's connections, its load processes, and the
client's own load (event-loop lag, CPU) over each batch.

Connections live for the whole sweep: the measured requests reuse the ones the warm-ups opened,
as vLLM's client reuses its session's pool. With more than one worker, independent requests are
sent by load processes (harness.bench.workers); sessions always run in this process (a session's
next prompt is built from its last answer, so its requests cannot be prepared ahead).
"""

from __future__ import annotations

import gc
import time
import uuid
from typing import Any

import numpy as np

from harness.bench.client import RequestOutput, Slot, build_payload
from harness.bench.client_config import ClientConfig
from harness.bench.dataset import SampleRequest
from harness.bench.loadgen import LoadRun, Progress, arrival_offsets
from harness.bench.progress import Display, log
from harness.bench.sessions import SessionRun, SessionSpec, count_prompts
from harness.bench.stops import Stops
from harness.bench.tokenizer import PromptTokenizer
from harness.bench.workers import LagMonitor, LoadReport, WorkerPool, default_workers
from harness.rundir.proxy_timings import HEADER as TIMING_HEADER

# The client warns that it may have been the limit when its event loop's timer fired this
# late at the 99th percentile, or a load process used this share of one core.
LAG_WARN_P99_MS = 5.0
BUSY_WARN = 0.9


class LoadRunner:
    def __init__(self, cfg: ClientConfig, stops: Stops, mode: str) -> None:
        self.cfg = cfg  # what it reads is the same for every shape and repeat
        self.stops = stops
        self.mode = mode
        self.tokenizer: PromptTokenizer | None = None  # counts a session's prompts
        self.slots: list[Slot] = []
        self.request_ids: list[str] = []  # the last prepared batch's X-Pdbench-Id values
        self.pool: WorkerPool | None = None  # load processes, with more than one worker
        self.workers = 1
        self.reports: list[LoadReport] = []  # the last batch's load processes' reports
        self.startup_cpu_s: float | None = None  # this process's CPU time at the first batch

    async def start(self, in_workers: bool) -> None:
        """The load processes, when the workload can use them and there is more than one."""
        cfg = self.cfg
        self.workers = (cfg.workers or default_workers(max(cfg.concurrency))) if in_workers else 1
        if self.workers > 1 and self.stops.interrupted is None:
            self.pool = WorkerPool(self.workers, cfg.url, cfg.endpoint == "chat")
            await self.pool.start()
            log(f"load generation: {self.workers} worker processes (pids {', '.join(map(str, self.pool.pids))})")

    async def close(self) -> None:
        for slot in self.slots:
            slot.close()
        if self.pool is not None:
            await self.pool.close()

    def prepare(self, reqs: list[SampleRequest]) -> tuple[list[bytes], list[RequestOutput]]:
        """Request bytes built before the clock starts, and the outputs to fill. With the proxy's
        timings, each request carries its id (self.request_ids) for the TTFT breakdown."""
        cfg = self.cfg
        target = cfg.target()
        batch = uuid.uuid4().hex[:12]
        self.request_ids = [f"{batch}-{i}" for i in range(len(reqs))] if cfg.proxy_timings_dir else []
        wire = [
            target.request_bytes(
                build_payload(cfg.endpoint, cfg.model, r.prompt, r.output_len, cfg.ignore_eos, cfg.sampling),
                {TIMING_HEADER: self.request_ids[i]} if self.request_ids else None,
            )
            for i, r in enumerate(reqs)
        ]
        return wire, [RequestOutput(r.prompt_len, r.output_len) for r in reqs]

    async def batch(
        self,
        label: str,
        reqs: list[SampleRequest],
        concurrency: int,
        rate: float,
        point_limit: float,
        rng: np.random.Generator,
        progress: Progress | None = None,
        offsets: np.ndarray | None = None,
    ) -> tuple[list[RequestOutput], str | None]:
        """`progress`: the batch's counters, when something else (the point's sentinels) reads them too;
        `offsets`: the requests' send times (s from the batch's start), else drawn from the rate."""
        stops = self.stops
        wire, outs = self.prepare(reqs)
        offsets = offsets if offsets is not None else arrival_offsets(len(reqs), rate, rng, self.cfg.burstiness)
        if (halted := stops.halted()) is not None:
            for o in outs:
                o.error = halted
            return outs, halted
        limit, reason = stops.limit(point_limit)
        progress = stops.progress = progress or Progress()
        if self.startup_cpu_s is None:
            self.startup_cpu_s = time.process_time()
        if self.pool is not None:
            return outs, await self._pool_batch(label, wire, outs, offsets, concurrency, progress, limit, reason)
        chat = self.cfg.endpoint == "chat"
        while len(self.slots) < concurrency:
            self.slots.append(Slot(self.cfg.target(), chat))
        run = LoadRun(
            self.cfg.url,
            chat,
            wire,
            outs,
            offsets,  # type: ignore[arg-type]  # an ndarray of floats, indexed like a sequence
            concurrency,
            self.cfg.request_timeout_s,
            progress,
            slots=self.slots,
        )
        stopped = await self._timed(label, run, progress, limit, reason)
        return outs, stopped

    async def session_batch(
        self,
        label: str,
        specs: list[SessionSpec],
        concurrency: int,
        point_limit: float,
        progress: Progress | None = None,
    ) -> tuple[SessionRun, str | None]:
        """A batch of sessions in this process; as `batch`."""
        cfg, tok, stops = self.cfg, self.tokenizer, self.stops
        assert tok is not None
        chat = cfg.endpoint == "chat"
        target = cfg.target()
        while len(self.slots) < concurrency:
            self.slots.append(Slot(target, chat, keep_text=True))
        batch = uuid.uuid4().hex[:12]
        turns = specs[0].turns if specs else 0
        self.request_ids = [f"{batch}-{i}" for i in range(len(specs) * turns)] if cfg.proxy_timings_dir else []
        ids = self.request_ids
        progress = stops.progress = progress or Progress()
        run = SessionRun(
            target,
            cfg.endpoint,
            cfg.model,
            cfg.ignore_eos,
            specs,
            concurrency,
            cfg.request_timeout_s,
            progress,
            self.slots,
            batch,
            (lambda i: {TIMING_HEADER: ids[i]}) if ids else (lambda i: None),
            cfg.sampling,
        )
        if (halted := stops.halted()) is not None:
            for o in run.outs:
                o.error = halted
            return run, halted
        limit, reason = stops.limit(point_limit)
        if self.startup_cpu_s is None:
            self.startup_cpu_s = time.process_time()
        stopped = await self._timed(label, run, progress, limit, reason)
        count_prompts(tok, run)
        return run, stopped

    async def _timed(
        self, label: str, run: LoadRun | SessionRun, progress: Progress, limit: float, reason: str | None
    ) -> str | None:
        """Run a batch in this process, its loop lag and CPU measured."""
        self.stops.current = run
        monitor = LagMonitor()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        # Everything allocated so far (tokenizer, prompts) is long-lived: keep the cyclic
        # GC from walking it in the middle of the batch, where a pause would be timed.
        gc.collect()
        gc.freeze()
        # The batch makes a dict per streamed event, which would run a young-generation
        # collection every few hundred events; nothing in it makes cycles, so the cyclic GC
        # waits until the batch is over.
        gc.disable()
        monitor.start()
        try:
            async with Display(label, progress, self.mode):
                stopped = await run.run(limit, limit_reason=reason)
        finally:
            gc.enable()
            self.stops.current = None
        lags = await monitor.stop()
        self.reports = [LoadReport(time.process_time() - cpu0, time.perf_counter() - wall0, lags)]
        return stopped

    async def _pool_batch(
        self,
        label: str,
        wire: list[bytes],
        outs: list[RequestOutput],
        offsets: np.ndarray,
        concurrency: int,
        progress: Progress,
        limit: float,
        reason: str | None,
    ) -> str | None:
        assert self.pool is not None
        self.stops.current = self.pool
        try:
            async with Display(label, progress, self.mode):
                stopped, self.reports = await self.pool.run_batch(
                    wire, outs, offsets.tolist(), concurrency, self.cfg.request_timeout_s, progress, limit, reason
                )
        finally:
            self.stops.current = None
        if self.pool.broken is not None and self.stops.dead is None:
            self.stops.on_dead(self.pool.broken)  # the points left cannot run
        return stopped

    def client_section(self, label: str) -> dict[str, Any]:
        """The client's own load over the measured batch, and warnings where it may have been
        the limit (then the point's latencies include the client's delays)."""
        reports = self.reports
        lags = np.asarray([x for r in reports for x in r.lags_ms] or [0.0])
        busy = [round(r.busy, 3) for r in reports]
        warnings = []
        p99, worst = float(np.percentile(lags, 99)), float(lags.max())
        if p99 > LAG_WARN_P99_MS:
            warnings.append(
                f"event-loop lag p99 {p99:.1f} ms (max {worst:.1f} ms) > {LAG_WARN_P99_MS:g} ms: "
                "the client was late reading responses; TTFT and ITL include its delay"
            )
        for k, b in enumerate(busy):
            if b > BUSY_WARN:
                warnings.append(
                    f"load process {k} at {b:.0%} CPU: the client may have been the bottleneck "
                    f"(more --workers, or fewer requests in flight per worker)"
                )
        for w in warnings:
            log(f"{label}: WARNING: {w}")
        return {
            "workers": self.workers,
            "startup_cpu_s": round(self.startup_cpu_s or 0.0, 3),
            "cpu_busy": busy,
            "loop_lag_ms": {
                "median": round(float(np.median(lags)), 3),
                "p99": round(p99, 3),
                "max": round(worst, 3),
            },
            "warnings": warnings,
        }
