"""Run a concurrency sweep: for each point, warmups then the measured requests.

What a point sends depends on the dataset: independent requests (random or from a file), at the
request rate; multi-turn sessions (harness.bench.sessions), `concurrency` of them in flight, each
turn built from the answer before it; or a Mooncake trace (harness.bench.trace), each request at
its timestamp over the speed, the concurrency capping those in flight.

A watchdog (harness.bench.watchdog) runs beside the load; when the target dies the
running batch stops at once, its finished requests are kept (the point's file is
written with `stop_reason`), and the points left are not run. `total_timeout_s`
ends a sweep the same way.

A first Ctrl-C (SIGINT) sends no more requests, waits at most `interrupt_grace_s` for those
in flight, writes the point so far with `stop_reason` INTERRUPTED (its sentinels finished and
recorded) and runs no more points; a second one cancels the requests in flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from harness import __version__, aio
from harness.bench.client import RequestOutput, Slot, Target, build_payload
from harness.bench.client_config import ClientConfig
from harness.bench.dataset import (
    FileRecord,
    SampleRequest,
    load_records,
    make_prefix,
    sample_file_requests,
    sample_requests,
)
from harness.bench.loadgen import LoadRun, Progress, arrival_offsets
from harness.bench.profile import PointProfiler, perturbation, window_figures
from harness.bench.progress import Display, log, pick_mode
from harness.bench.results import (
    BenchResult,
    ResultExistsError,
    check_writable,
    write_result,
    write_spare,
)
from harness.bench.resume import replay_of, set_aside, why_not_kept
from harness.bench.runtime_info import runtime_metadata
from harness.bench.sentinels import (
    PointSentinels,
    Reference,
    Sentinel,
    SentinelClient,
    answer_references,
    write_reference,
)
from harness.bench.serve_metrics import compute_metrics
from harness.bench.sessions import SessionRun, SessionSpec, count_prompts, describe, plan_sessions, session_summary
from harness.bench.slo_ladder import Ladder, repeats_stop
from harness.bench.slo_record import SearchRecord, Verdict, goodput_per_device, judge
from harness.bench.tokenizer import PromptTokenizer, load_tokenizer
from harness.bench.trace import TraceRecord, load_trace, schedule_section, synthesize
from harness.bench.trace import offsets as trace_offsets
from harness.bench.ttft_breakdown import judge_point, kv_transfer_ms, read_role_timings, ttft_breakdown
from harness.bench.validity_probe import PointProbe, parse_target
from harness.bench.watchdog import TargetDied, Watchdog
from harness.bench.workers import LagMonitor, LoadReport, WorkerPool, default_workers
from harness.config.benchmark import Shape
from harness.rundir import ResultName
from harness.rundir.bottleneck_summary import Baseline
from harness.rundir.kv_ceiling import KvCeiling
from harness.rundir.kv_ceiling import read as read_kv_ceiling
from harness.rundir.paths import (
    KV_CEILING,
    REPEATS,
    SENTINEL_REFERENCE,
    SLO_SEARCH,
    repeat_subdir,
    sentinel_record_name,
)
from harness.rundir.profile_summary import ProfileSummary, ServerTraces, WindowFigures
from harness.rundir.proxy_timings import HEADER as TIMING_HEADER
from harness.rundir.proxy_timings import read_all as read_timings
from harness.rundir.result_name import point_tag
from harness.validity import ClientCounts, unverified
from harness.validity.completed import with_completed
from harness.validity.kv_handoff import describe as describe_handoff
from harness.validity.kv_handoff import point_handoff
from harness.validity.kv_transport import judge as judge_transport
from harness.validity.kv_transport import with_kv_transport
from harness.validity.outputs import OutputsCheck, with_outputs_check

# Sub-streams of the seed per point, so a point's prompts do not depend on which
# other points are in the sweep, and points never repeat each other's prompts
# (a repeat would hit the server's prefix cache and flatter TTFT). The shared
# prefix uses concurrency 0, which no point has. A profiled window's prompts are its own
# (_PROFILE): the measured ones again would hit the prefix cache.
_MAIN, _WARMUP, _ARRIVALS, _PREFIX, _SENTINEL, _PROFILE = 0, 1, 2, 3, 4, 5

# The client warns that it may have been the limit when its event loop's timer fired this
# late at the 99th percentile, or a load process used this share of one core.
LAG_WARN_P99_MS = 5.0
BUSY_WARN = 0.9
# How long a point waits for the proxy's timing records of its completed requests.
PROXY_RECORDS_WAIT_S = 2.0

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

__all__ = ["INTERRUPTED", "PointOutcome", "TargetDied", "arrival_offsets", "run_sweep", "run_sweep_detailed"]


@dataclass
class PointOutcome:
    concurrency: int
    path: Path | None  # None when the point could not be run or written
    completed: int = 0
    failed: int = 0
    error: str | None = None
    shape: str | None = None  # isl_<I>_osl_<O> in a several-shape sweep
    kept: bool = False  # resumed: the result of an earlier run, not run again
    interrupted: bool = False  # cut short or not run because of a Ctrl-C

    @property
    def ok(self) -> bool:
        return self.path is not None and self.failed == 0 and self.error is None


@dataclass(frozen=True)
class _Point:
    shape: Shape
    concurrency: int
    path: Path
    kept: bool = False


class _Sweep:
    def __init__(self, cfg: ClientConfig) -> None:
        self.base = cfg
        self.cfg = cfg  # the base config with the running shape's isl, osl and range_ratio
        self.shape_tag: str | None = None  # the running shape's tag in a several-shape sweep
        self.mode = pick_mode(cfg.progress)
        self.dead: str | None = None  # why the target is considered dead
        self.current: LoadRun | WorkerPool | SessionRun | None = None
        self.deadline = math.inf  # perf_counter bound of the whole sweep
        self.tokenizer: PromptTokenizer | None = None
        self.prefix = ""
        self.records: list[FileRecord] = []
        self.trace: list[TraceRecord] = []  # dataset mooncake_trace: the requests every point replays
        # Connections live for the whole sweep: the measured requests reuse the ones
        # the warmups opened, as vLLM's client reuses its session's pool.
        self.slots: list[Slot] = []
        self.request_ids: list[str] = []  # the last prepared batch's X-Pdbench-Id values
        self.pool: WorkerPool | None = None  # load processes, with more than one worker
        self.workers = 1
        self.reports: list[LoadReport] = []  # the last batch's load processes' reports
        self.startup_cpu_s: float | None = None  # this process's CPU time at the first batch
        self.runtime: dict[str, Any] = {}  # what the servers ran (runtime_info), in every result
        self.kv_ceiling: KvCeiling | None = None  # the job's KV ceiling (state/kv_ceiling.json); None outside a job
        self.progress = Progress()  # the running batch's counters
        # Sentinel prompts by point tag, answered by the reference before the sweep.
        self.sentinels: dict[str, list[Sentinel]] = {}
        self.reference: Reference | None = None
        self.sentinel_client: SentinelClient | None = None
        self.references: asyncio.Task[None] | None = None  # the reference answers, beside the first warmups
        # Ctrl-C: how many so far, and what waits that a first one ends.
        self.interrupted: str | None = None
        self.interrupts = 0
        self.first_interrupt_at = 0.0
        self.halt = asyncio.Event()  # set by a first Ctrl-C: ends a cooldown
        self.setup: asyncio.Task[None] | None = None  # the work before the first point
        self.main: asyncio.Task[Any] | None = None  # the sweep, cancelled by a second Ctrl-C between batches
        self.point_sentinels: PointSentinels | None = None  # the running point's, which a Ctrl-C cancels
        self.profiling: PointProfiler | None = None  # the started profiler, whose stop a Ctrl-C bounds
        self.unsent = 0  # the last measured batch's requests never sent (it was stopped)
        self.repeat = 0  # an SLO search's repeat of the running point (0: its first measurement)
        self.bottleneck_bases: dict[str | None, Baseline] = {}  # per shape: the bottleneck's growth baseline

    # -- stops ----------------------------------------------------------------

    def on_dead(self, reason: str) -> None:
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

    def _stop_invalid(self, concurrency: int, why: str) -> None:
        """A point whose evidence is already bad stops now (validity.early_check_s)."""
        reason = f"invalid point: {why}"
        log(f"C={concurrency}{self._shape_text()}: stopping the point: {why}")
        if self.cfg.validity.on_early_invalid == "stop_sweep":
            self.dead = f"validity.on_early_invalid=stop_sweep after C={concurrency}: {why}"
        if self.current is not None:
            self.current.stop(reason)

    def _total_reason(self) -> str:
        return f"total timeout: the sweep ran past total_timeout_s={self.cfg.total_timeout_s:g}"

    def _limit(self, point_limit: float) -> tuple[float, str | None]:
        """This batch's time bound and, when the sweep's bound is the tighter, its reason."""
        left = self.deadline - time.perf_counter()
        if left < point_limit:
            return max(0.0, left), self._total_reason()
        return point_limit, None

    # -- requests -------------------------------------------------------------

    def sample(self, count: int, concurrency: int, stream: int) -> list[SampleRequest]:
        cfg, tok = self.cfg, self.tokenizer
        assert tok is not None and cfg.isl is not None and cfg.osl is not None  # set per shape
        rng = np.random.default_rng(self._seed_key(concurrency, stream))
        # Sessions: independent prompts of the first turn's shape (the sentinels beside them).
        if cfg.dataset in ("random", "sessions"):
            return sample_requests(
                tok,
                count,
                cfg.isl,
                cfg.osl,
                cfg.range_ratio,
                cfg.range_ratio_convention,
                rng,
                prefix=self.prefix,
                prefix_len=cfg.random_prefix_len,
            )
        if cfg.dataset == "mooncake_trace":
            # Warmups and sentinels take the trace's first requests' shapes with their own seed
            # streams: blocks of their own, so they never warm the measured ones.
            assert cfg.trace is not None
            return synthesize(tok, self.trace[:count], cfg.trace.block_tokens, rng)
        return sample_file_requests(tok, self.records, count, cfg.osl, rng)

    def plan(self, count: int, concurrency: int, stream: int) -> list[SessionSpec]:
        """`count` sessions, drawn from the point's seed sub-stream (before the clock starts)."""
        cfg, tok = self.cfg, self.tokenizer
        assert tok is not None and cfg.isl is not None and cfg.osl is not None and cfg.sessions is not None
        rng = np.random.default_rng(self._seed_key(concurrency, stream))
        return plan_sessions(
            tok,
            count,
            cfg.isl,
            cfg.osl,
            cfg.sessions,
            cfg.range_ratio,
            cfg.range_ratio_convention,
            rng,
            prefix=self.prefix,
            prefix_len=cfg.random_prefix_len,
        )

    def requests_for(self, concurrency: int) -> int:
        """The point's measured requests: the trace's (each point replays it), else the config's."""
        return len(self.trace) if self.trace else self.cfg.num_prompts_for(concurrency)

    def _seed_key(self, concurrency: int, stream: int) -> list[int]:
        # In a several-shape sweep the shape is part of the key: the same concurrency of two
        # shapes must not share prompt tokens (a shared start would hit the prefix cache).
        assert self.cfg.isl is not None and self.cfg.osl is not None
        shape = [self.cfg.isl, self.cfg.osl] if self.shape_tag else []
        # A repeat sends prompts of its own: the first measurement's would hit the prefix cache.
        return [self.cfg.seed, *shape, concurrency, stream, *([self.repeat] if self.repeat else [])]

    def _use_shape(self, shape: Shape) -> None:
        self.cfg = self.base.model_copy(
            update={"isl": shape.isl, "osl": shape.osl, "range_ratio": shape.range_ratio, "shapes": []}
        )
        self.shape_tag = shape.tag if self.base.multi_shape else None

    def prepare(self, reqs: list[SampleRequest]) -> tuple[list[bytes], list[RequestOutput]]:
        """Request bytes built before the clock starts, and the outputs to fill. With the proxy's
        timings, each request carries its id (self.request_ids) for the TTFT breakdown."""
        cfg = self.cfg
        target = Target.from_url(cfg.url)
        batch = uuid.uuid4().hex[:12]
        self.request_ids = [f"{batch}-{i}" for i in range(len(reqs))] if cfg.proxy_timings_dir else []
        wire = [
            target.request_bytes(
                build_payload(cfg.endpoint, cfg.model, r.prompt, r.output_len, cfg.ignore_eos),
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
        wire, outs = self.prepare(reqs)
        offsets = offsets if offsets is not None else arrival_offsets(len(reqs), rate, rng, self.cfg.burstiness)
        if (halted := self.dead or self.interrupted) is not None:
            for o in outs:
                o.error = halted
            return outs, halted
        limit, reason = self._limit(point_limit)
        progress = self.progress = progress or Progress()
        if self.startup_cpu_s is None:
            self.startup_cpu_s = time.process_time()
        if self.pool is not None:
            return outs, await self._pool_batch(label, wire, outs, offsets, concurrency, progress, limit, reason)
        chat = self.cfg.endpoint == "chat"
        while len(self.slots) < concurrency:
            self.slots.append(Slot(Target.from_url(self.cfg.url), chat))
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
        self.current = run
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
            self.current = None
        lags = await monitor.stop()
        self.reports = [LoadReport(time.process_time() - cpu0, time.perf_counter() - wall0, lags)]
        return outs, stopped

    async def session_batch(
        self,
        label: str,
        specs: list[SessionSpec],
        concurrency: int,
        point_limit: float,
        progress: Progress | None = None,
    ) -> tuple[SessionRun, str | None]:
        """A batch of sessions in this process (a session's next prompt is built from its last
        answer, so its requests cannot be prepared ahead for the load processes); as `batch`."""
        cfg, tok = self.cfg, self.tokenizer
        assert tok is not None
        chat = cfg.endpoint == "chat"
        target = Target.from_url(cfg.url)
        while len(self.slots) < concurrency:
            self.slots.append(Slot(target, chat, keep_text=True))
        batch = uuid.uuid4().hex[:12]
        turns = specs[0].turns if specs else 0
        self.request_ids = [f"{batch}-{i}" for i in range(len(specs) * turns)] if cfg.proxy_timings_dir else []
        ids = self.request_ids
        progress = self.progress = progress or Progress()
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
        )
        if (halted := self.dead or self.interrupted) is not None:
            for o in run.outs:
                o.error = halted
            return run, halted
        limit, reason = self._limit(point_limit)
        if self.startup_cpu_s is None:
            self.startup_cpu_s = time.process_time()
        self.current = run
        monitor = LagMonitor()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        gc.collect()  # as in batch: no cyclic collection in the middle of the timed requests
        gc.freeze()
        gc.disable()
        monitor.start()
        try:
            async with Display(label, progress, self.mode):
                stopped = await run.run(limit, limit_reason=reason)
        finally:
            gc.enable()
            self.current = None
        lags = await monitor.stop()
        self.reports = [LoadReport(time.process_time() - cpu0, time.perf_counter() - wall0, lags)]
        count_prompts(tok, run)
        return run, stopped

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
        self.current = self.pool
        try:
            async with Display(label, progress, self.mode):
                stopped, self.reports = await self.pool.run_batch(
                    wire, outs, offsets.tolist(), concurrency, self.cfg.request_timeout_s, progress, limit, reason
                )
        finally:
            self.current = None
        if self.pool.broken is not None and self.dead is None:
            self.on_dead(self.pool.broken)  # the points left cannot run
        return stopped

    # -- sentinels -------------------------------------------------------------

    def _plan_sentinels(self, points: list[_Point], session: aiohttp.ClientSession) -> bool:
        """Sample every point's sentinels; True when a reference is there to answer them."""
        base = self.base
        if not any(base.sentinels.per_point(self.requests_for(c)) for c in base.concurrency):
            return False
        self.reference = Reference.of(base)
        if self.reference is None:
            log("sentinels: no reference instance (no prefill or aggregated --scrape target): outputs not checked")
            return False
        for pt in points:
            if pt.kept:
                continue
            self._use_shape(pt.shape)
            m = self.cfg.sentinels.per_point(self.requests_for(pt.concurrency))
            reqs = self.sample(m, pt.concurrency, _SENTINEL)
            self.sentinels[point_tag(pt.concurrency, self.shape_tag)] = [Sentinel(i, r) for i, r in enumerate(reqs)]
        self.sentinel_client = SentinelClient(base, session)
        return bool(self.sentinels)

    async def _answer_references(self) -> None:
        """The reference answers every sentinel of the sweep, all at once up to the highest
        concurrency. It runs beside the load processes' start and the first point's warmups
        (unmeasured), and the first measured batch waits for it (_references_ready)."""
        base, reference, client = self.base, self.reference, self.sentinel_client
        assert reference is not None and client is not None
        total = sum(len(v) for v in self.sentinels.values())
        t0 = time.perf_counter()
        await answer_references(client, reference, self.sentinels, max(base.concurrency))
        answered = sum(
            s.reference is not None and s.reference.error is None for v in self.sentinels.values() for s in v
        )
        log(
            f"sentinels: {answered} of {total} reference answers from {reference.description} in {time.perf_counter() - t0:.1f} s"
        )
        if answered < total:
            bad = next(s.reference for v in self.sentinels.values() for s in v if s.reference and s.reference.error)
            log(f"sentinels: the reference failed to answer: {bad.error if bad else '?'}")
        write_reference(Path(base.result_dir) / base.sentinels_dir / SENTINEL_REFERENCE, reference, self.sentinels)

    async def _references_ready(self) -> None:
        """Before a measured batch: the reference answers are in (each request is bounded), or a
        Ctrl-C came (the batch then sends nothing)."""
        task = self.references
        if task is None:
            return
        if not task.done():
            log("sentinels: waiting for the reference answers before the measured requests")
            halt = asyncio.create_task(self.halt.wait())
            await asyncio.wait({task, halt}, return_when=asyncio.FIRST_COMPLETED)
            halt.cancel()
        if task.done():
            task.result()  # a failure to write reference.json is the point's

    def _point_sentinels(self, concurrency: int, measured: int, progress: Progress) -> PointSentinels | None:
        sentinels = self.sentinels.get(point_tag(concurrency, self.shape_tag))
        if not sentinels or self.reference is None or self.sentinel_client is None:
            return None
        return PointSentinels(self.sentinel_client, self.cfg.url, sentinels, measured, concurrency, progress)

    def _outputs_check(self, concurrency: int, sentinels: PointSentinels | None) -> OutputsCheck | None:
        """The point's sentinel comparison; None when sentinels are off."""
        tol = self.cfg.sentinels
        m = tol.per_point(self.requests_for(concurrency))
        if not m:
            return None
        if sentinels is None:
            why = "no reference instance: give the client a prefill or aggregated --scrape target"
            return OutputsCheck(
                sent=0,
                answered=0,
                compared=0,
                exact=0,
                matched=0,
                match_tokens=tol.match_tokens,
                max_diverged=tol.max_diverged,
                why_not_compared=why,
            )
        return sentinels.check(tol.match_tokens, tol.max_diverged)

    def _sentinels_beside_sessions(self, check: OutputsCheck | None, sent: bool) -> str:
        """The sessions section's word on the sentinels: independent prompts of the first turn's
        shape go beside the sessions, or why none did."""
        if check is None:
            return "none: sentinels.enabled is false"
        if not sent:
            return f"none sent: {check.why_not_compared}"
        return (
            f"{check.sent} independent greedy prompts of {self.cfg.isl}/{self.cfg.osl} tokens went beside the "
            "sessions (validity rule outputs_match)"
        )

    def _record_sentinels(self, concurrency: int, sentinels: PointSentinels, check: OutputsCheck) -> dict[str, Any]:
        """Writes the point's sentinel record; returns the result's `sentinels` section."""
        assert self.reference is not None
        tag = point_tag(concurrency, self.shape_tag)
        record = Path(self.cfg.sentinels_dir) / sentinel_record_name(tag)
        sentinels.write_record(Path(self.cfg.result_dir) / record, tag, self.reference.description, check)
        summary = sentinels.summary(check, self.reference.description, str(record))
        verdict = "matched" if check.matched == check.compared else "DIVERGED from"
        log(
            f"C={concurrency}{self._shape_text()}: sentinels: {check.matched} of {check.compared} compared "
            f"{verdict} the reference ({check.sent} sent)"
        )
        return summary.model_dump(mode="json")

    # -- one point --------------------------------------------------------------

    async def _proxy_records(self, directory: Path, outs: list[RequestOutput]) -> dict[str, dict[str, Any]]:
        """The proxy's timing records of this batch. The proxy writes a request's record just after
        the response's last byte, which the client may have read first: wait (bounded) for the
        records of the completed requests."""
        ids = set(self.request_ids)
        done = {rid for rid, o in zip(self.request_ids, outs, strict=False) if o.success}
        deadline = time.monotonic() + PROXY_RECORDS_WAIT_S
        records = read_timings(directory, ids)
        while not done <= records.keys() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            records = read_timings(directory, ids)
        return records

    async def point(self, concurrency: int) -> BenchResult | str:
        """The point's result, or why it has none (stopped during its warmups)."""
        cfg, sess = self.cfg, self.cfg.sessions
        n, n_warm = self.requests_for(concurrency), cfg.num_warmups_for(concurrency)
        offs: np.ndarray | None = None  # the trace's send times
        if sess is not None:
            n_sessions, n_warm_sessions = sess.sessions_for(concurrency), sess.warmup_sessions_for(concurrency)
            if self.mode == "plain":
                log(f"C={concurrency}{self._shape_text()}: {describe(sess, n_sessions, n_warm_sessions)}")
        else:
            rate_text = "inf" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g}/s"
            plan = f"{n} requests at rate {rate_text}"
            if cfg.trace is not None:
                offs = trace_offsets(self.trace[:n], cfg.trace.speed)
                plan = f"the trace's {n} requests over {float(offs[-1]):.1f} s (speed {cfg.trace.speed:g})"
            if self.mode == "plain":
                log(f"C={concurrency}{self._shape_text()}: {n_warm} warmups, then {plan}")
        measured = self._window(f"C={concurrency}{self._shape_text()}", concurrency, n, _MAIN, offs)
        if n_warm:
            # Warmups go out all at once (limited by C) and are left out of the metrics.
            warm_label, warm_limit = (
                f"C={concurrency}{self._shape_text()} warmup",
                cfg.point_timeout_for(n_warm, concurrency),
            )
            if sess is not None:
                warm_run, stopped = await self.session_batch(
                    warm_label, self.plan(n_warm_sessions, concurrency, _WARMUP), concurrency, warm_limit
                )
                warm: list[RequestOutput] = list(warm_run.outs)
            else:
                warm, stopped = await self.batch(
                    warm_label,
                    self.sample(n_warm, concurrency, _WARMUP),
                    concurrency,
                    math.inf,
                    warm_limit,
                    np.random.default_rng(self._seed_key(concurrency, _ARRIVALS)),  # unused at rate inf
                )
            if stopped is not None and (
                self.dead is not None or self.interrupted is not None or stopped == self._total_reason()
            ):
                return f"stopped during warmups: {stopped}"
            if bad := [o for o in warm if not o.success]:
                log(f"C={concurrency}{self._shape_text()}: {len(bad)}/{n_warm} warmup requests failed: {bad[0].error}")
                if len(bad) == len(warm):
                    # A wrong model name, a server that refuses every request: the measured
                    # requests would fail the same way. Neither they nor the points left are sent.
                    why = f"{WARMUPS_FAILED} (model {cfg.model!r} at {cfg.url}): {bad[0].error}"
                    self.dead = why
                    return why

        await self._references_ready()
        date = datetime.now().strftime("%Y%m%d-%H%M%S")
        wall_offset = time.time() - time.perf_counter()  # request times are perf_counter
        probe = None
        if cfg.scrape:
            where = point_tag(concurrency, self.shape_tag)
            probe = PointProbe(
                cfg.scrape,
                Path(cfg.result_dir) / cfg.metrics_dir / where,
                cfg.validity,
                cfg.kv_connector,
                completed=lambda: self.progress.done - self.progress.failed,
                kv_ceiling=self.kv_ceiling,
                on_invalid=lambda why: self._stop_invalid(concurrency, why),
            )
            await probe.start()
        profiler = self._profiler(concurrency)
        # perturbation false: the measured window itself is profiled (else a second window is, below).
        in_window = profiler if profiler is not None and not profiler.settings.perturbation else None
        if in_window is not None:
            self._profiling(in_window)
            await in_window.start()  # a refusal is in its server's entry; the point runs all the same
        progress = Progress()
        sentinels = self.point_sentinels = self._point_sentinels(concurrency, n, progress)
        if sentinels is not None:
            sentinels.start()
        outs, stopped, run = await measured(progress)
        if sentinels is not None:
            # After a Ctrl-C the sentinels still out are not waited for, even if the batch ended.
            await sentinels.finish(stopped is not None or self.interrupted is not None)
            self.point_sentinels = None
        traces = await in_window.stop() if in_window is not None else None
        self._profiling(None)
        self.unsent = sum(o.start_time is None for o in outs)
        if self.interrupted is not None and self.unsent == len(outs):
            if probe is not None:
                await probe.cancel()
            return f"{INTERRUPTED} before its measured requests were sent"
        s_prompt, s_output, s_ok, s_failed = sentinels.counts() if sentinels is not None else (0, 0, 0, 0)
        backend = "openai-chat" if cfg.endpoint == "chat" else "openai"
        metadata = _metadata(cfg) | self.runtime
        if probe is not None:
            sent = [o for o in outs if o.start_time is not None]
            failed = sum(not o.success for o in outs) + s_failed
            if self.interrupted is not None:
                # A Ctrl-C is the user's stop, not the servers' failure: the requests it kept from
                # being sent or cancelled do not count as failed (a timeout's or a dead target's do).
                failed -= sum(not o.success and (o.error or "").startswith(INTERRUPTED) for o in outs)
                failed -= sentinels.cancelled() if sentinels is not None else 0
            # The servers saw the sentinels too: their requests and tokens count here.
            verdict = await probe.finish(
                ClientCounts(
                    prompt_tokens=sum(o.prompt_len for o in sent) + s_prompt,
                    output_tokens=sum(o.output_tokens for o in sent) + s_output,
                    completed=sum(o.success for o in outs) + s_ok,
                    failed=failed,
                )
            )
        else:
            verdict = unverified("no server /metrics were scraped (no scrape targets given)")
        extra: dict[str, Any] = {}
        check = self._outputs_check(concurrency, sentinels)
        verdict = with_outputs_check(verdict, check)
        first_error = next((o.error for o in outs if not o.success and o.error), None)
        verdict = with_completed(verdict, sum(o.success for o in outs), len(outs), first_error)
        records: dict[str, dict[str, Any]] = {}
        if cfg.proxy_timings_dir:
            records = await self._proxy_records(Path(cfg.result_dir) / cfg.proxy_timings_dir, outs)
        handoff = point_handoff(
            cfg.kv_connector,
            probe.targets if probe is not None else [],
            probe.out_dir if probe is not None else None,
            records.values(),
            cfg.validity.kv_judged_min_bytes,
        )
        if probe is not None and cfg.kv_connector is not None and probe.disaggregated:
            # How the KV moved, from the connector's own account, against the job's ceiling.
            transport, handoff = judge_transport(handoff, self.kv_ceiling, cfg.validity, cfg.kv_connector)
            verdict = with_kv_transport(verdict, transport)
        if handoff is not None:
            extra["kv_handoff"] = handoff.model_dump(mode="json")
            log(f"C={concurrency}{self._shape_text()}: {describe_handoff(handoff)}")
        if probe is not None and probe.prefix_cache is not None:
            extra["prefix_cache"] = probe.prefix_cache.model_dump(mode="json")
        if sentinels is not None and check is not None:
            extra["sentinels"] = self._record_sentinels(concurrency, sentinels, check)
        if run is not None and sess is not None:
            note = self._sentinels_beside_sessions(check, sentinels is not None)
            extra["sessions"] = session_summary(run, sess, note).model_dump(mode="json")
        if offs is not None and cfg.trace is not None:
            extra["schedule"] = schedule_section(outs, offs, cfg.trace.speed, concurrency).model_dump(mode="json")
        # valid: true / false / null (unverified); the verdict and its evidence under validity.
        metadata.update(valid=verdict.valid, validity=verdict.model_dump(mode="json"))
        if probe is not None and verdict.verdict != "valid":
            log(f"C={concurrency}{self._shape_text()}: {verdict.verdict.upper()} point: {'; '.join(verdict.reasons)}")
        metrics = compute_metrics(outs, cfg.percentiles, {str(k): v for k, v in cfg.goodput.items()})
        extra["client"] = self._client_section(concurrency)
        kv = kv_transfer_ms(verdict if probe is not None else None)
        servers = read_role_timings(probe.targets, probe.out_dir) if probe is not None else {}
        if cfg.proxy_timings_dir:
            extra["ttft_breakdown"] = ttft_breakdown(outs, self.request_ids, records, kv, servers)
        extra["bottleneck"] = None  # no request completed: nothing to judge, nor a baseline for later points
        if metrics["completed"]:
            extra["bottleneck"] = judge_point(
                concurrency,
                extra.get("ttft_breakdown"),
                servers,
                kv,
                metrics.get("mean_tpot_ms"),
                extra["client"],
                self.bottleneck_bases,
                self.shape_tag,
                e2el_ms=metrics.get("mean_e2el_ms"),
            )
        if profiler is not None:
            figures = window_figures(metrics)
            if traces is not None:  # the measured window was the profiled one
                errors = [f"the window stopped: {stopped}"] if stopped is not None else []
                errors += profiler.cut_short(traces)
                extra["profile"] = ProfileSummary(
                    tool=profiler.settings.tool, window="measured", profiled=figures, servers=traces, errors=errors
                )
            else:
                extra["profile"] = await self._profiled_window(profiler, concurrency, n, stopped, figures, offs)
        sent_at = [o.start_time for o in outs if o.start_time is not None and o.end_time is not None]
        start_unix = min(sent_at) + wall_offset if sent_at else None
        return BenchResult(
            date=date,
            endpoint_type=backend,
            backend=backend,
            model_id=cfg.model,
            tokenizer_id=cfg.tokenizer,
            num_prompts=n,
            request_rate="inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
            burstiness=cfg.burstiness,
            max_concurrency=concurrency,
            range_ratio=cfg.range_ratio,
            range_ratio_convention=cfg.range_ratio_convention,
            random_input_len=cfg.isl,
            random_output_len=cfg.osl,
            random_prefix_len=cfg.random_prefix_len,
            dataset_name=cfg.dataset,
            dataset_path=cfg.dataset_path,
            goodput_slos={f"{k}_ms": v for k, v in cfg.goodput.items()} or None,
            stop_reason=stopped,
            benchmark_start_time_unix=start_unix,
            benchmark_end_time_unix=None if start_unix is None else start_unix + metrics["duration"],
            metadata=metadata,
            **metrics,
            **extra,
        )

    def _window(
        self, label: str, concurrency: int, n: int, stream: int, offs: np.ndarray | None
    ) -> Callable[[Progress | None], Awaitable[tuple[list[RequestOutput], str | None, SessionRun | None]]]:
        """One window of the point's requests (the measured one: stream _MAIN; the profiled one:
        _PROFILE), drawn now, before any clock; the returned call sends them (`progress` as in
        batch) and gives their outputs, why they stopped early, and the sessions' run if any."""
        cfg, sess = self.cfg, self.cfg.sessions
        # A replay lasts at least the trace's span over its speed.
        limit = cfg.point_timeout_for(n, concurrency) + (float(offs[-1]) if offs is not None else 0.0)
        if sess is not None:
            specs = self.plan(sess.sessions_for(concurrency), concurrency, stream)

            async def sessions(progress: Progress | None) -> tuple[list[RequestOutput], str | None, SessionRun]:
                run, stopped = await self.session_batch(label, specs, concurrency, limit, progress)
                return list(run.outs), stopped, run

            return sessions
        reqs = self.sample(n, concurrency, stream)

        async def requests(progress: Progress | None) -> tuple[list[RequestOutput], str | None, None]:
            # Both windows' gaps come from the point's arrivals stream: the same send times.
            rng = np.random.default_rng(self._seed_key(concurrency, _ARRIVALS))
            outs, stopped = await self.batch(label, reqs, concurrency, cfg.request_rate, limit, rng, progress, offs)
            return outs, stopped, None

        return requests

    # -- profiles (benchmark.profile) ---------------------------------------------

    def _profiling(self, profiler: PointProfiler | None) -> None:
        """The profiler started now (None: stopped), whose stop a first Ctrl-C bounds; one
        started after that Ctrl-C is bounded at once."""
        self.profiling = profiler
        if profiler is not None and self.interrupted is not None:
            profiler.hurry(INTERRUPT_PROFILE_STOP_S, self.interrupted)

    def _profiler(self, concurrency: int) -> PointProfiler | None:
        """The point's profiler when it is one of profile.points (an SLO search's repeats are not)
        and servers of the profiled roles are among the scrape targets (a job's aggregated baseline
        has none of prefill's and decode's)."""
        prof = self.cfg.profile
        if prof is None or concurrency not in prof.points or self.repeat:
            return None
        targets = [parse_target(t) for t in self.cfg.scrape]
        tag = point_tag(concurrency, self.shape_tag)
        profiler = PointProfiler(prof, targets, Path(self.cfg.result_dir), tag, log)
        if not profiler.servers:
            scraped = ", ".join(f"{name} ({role})" for name, role, _ in targets) or "none"
            log(
                f"C={concurrency}{self._shape_text()}: not profiled: no server of the profiled role(s) "
                f"{', '.join(prof.roles)} among the scrape targets ({scraped})"
            )
            return None
        return profiler

    async def _profiled_window(
        self,
        profiler: PointProfiler,
        concurrency: int,
        n: int,
        stopped: str | None,
        unprofiled: WindowFigures,
        offs: np.ndarray | None,
    ) -> ProfileSummary:
        """After the point's measured window: the same number of requests of the same shape, rate
        and arrival times (prompts of their own), profiled. Not run when the measured window or the
        sweep stopped, or no server's profiler started; the section then says why."""
        cfg = self.cfg
        label, tool = f"C={concurrency}{self._shape_text()} profiled", profiler.settings.tool

        def not_run(why: str, servers: list[ServerTraces]) -> ProfileSummary:
            log(f"{label}: not run: {why}")
            return ProfileSummary(
                tool=tool,
                window="second",
                profiled=None,
                unprofiled=unprofiled,
                servers=servers,
                errors=[f"not profiled: {why}"],
            )

        if (why := stopped or self._stopped()) is not None:
            return not_run(f"the measured window stopped ({why})", [])
        window = self._window(label, concurrency, n, _PROFILE, offs)  # drawn before the profiler runs
        self._profiling(profiler)
        try:
            if not await profiler.start():
                return not_run("no server's profiler started", profiler.refused())
            try:
                outs, halted, _ = await window(None)
            except asyncio.CancelledError:
                raise  # a second Ctrl-C: the job stops its servers now; no trace is waited for
            except Exception:
                await profiler.stop()  # a profiler left on would refuse the next point's start
                raise
            traces = await profiler.stop()
        finally:
            self._profiling(None)
        metrics = compute_metrics(outs, cfg.percentiles, {str(k): v for k, v in cfg.goodput.items()})
        profiled = window_figures(metrics)
        ratios = perturbation(profiled, unprofiled)
        log(
            f"{label}: output {profiled.output_throughput:.1f} tok/s, median TTFT {profiled.median_ttft_ms:.1f} ms, "
            f"median TPOT {profiled.median_tpot_ms:.2f} ms; profiled/unprofiled: "
            + ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in ratios.items())
        )
        return ProfileSummary(
            tool=tool,
            window="second",
            profiled=profiled,
            unprofiled=unprofiled,
            perturbation=ratios,
            servers=traces,
            errors=([f"the profiled window stopped: {halted}"] if halted is not None else [])
            + profiler.cut_short(traces),
        )

    # -- the sweep ----------------------------------------------------------------

    async def run(self) -> list[PointOutcome]:
        """The sweep, with Ctrl-C handled by on_interrupt while it runs (in the main thread only:
        elsewhere the embedding program owns SIGINT)."""
        loop = asyncio.get_running_loop()
        ours = threading.current_thread() is threading.main_thread()
        if ours:
            loop.add_signal_handler(signal.SIGINT, self.on_interrupt)
        self.main = asyncio.current_task()
        try:
            return await self._run()
        except asyncio.CancelledError:
            if self.interrupts < 2:
                raise
            raise KeyboardInterrupt from None
        finally:
            if ours:
                loop.remove_signal_handler(signal.SIGINT)

    async def _prepare(self, watchdog: Watchdog, points: list[_Point], session: aiohttp.ClientSession) -> None:
        """What comes before the first point; a first Ctrl-C cancels it. The reference answers
        start here and go on beside the first point's warmups."""
        await watchdog.preflight(session)  # raises TargetDied: nothing was sent
        self.runtime = await runtime_metadata(self.base, log)
        if self.base.runtime_records_dir:  # the node measured it before starting this client
            self.kv_ceiling = read_kv_ceiling(Path(self.base.result_dir) / self.base.runtime_records_dir / KV_CEILING)
            if self.base.kv_connector is not None and self.kv_ceiling is not None:
                log(f"KV ceiling: {self.kv_ceiling.describe()}")
        if self._plan_sentinels(points, session):
            self.references = asyncio.create_task(self._answer_references())

    async def _run(self) -> list[PointOutcome]:
        base = self.base
        # Fail before sending any load rather than after a long point: a result directory that
        # cannot take a file (read-only, full, no permission); the trace, as its length is every
        # point's request count (which resume checks).
        check_writable(Path(base.result_dir))
        if base.dataset == "mooncake_trace":
            assert base.trace is not None and base.dataset_path is not None
            self.trace = load_trace(base.dataset_path)[: base.trace.max_requests]
        points = self._plan_points()
        if not base.scrape:
            log("no scrape targets: every point is recorded unverified (metadata.valid null)")
        if base.dataset in ("jsonl", "sharegpt"):
            self.records = load_records(base.dataset_path, base.dataset)  # type: ignore[arg-type]
        self.tokenizer = load_tokenizer(base.tokenizer)
        if base.dataset in ("random", "sessions") and base.random_prefix_len:
            self.prefix = make_prefix(
                self.tokenizer, base.random_prefix_len, np.random.default_rng([base.seed, 0, _PREFIX])
            )

        outcomes: list[PointOutcome] = []
        watchdog = Watchdog(base.base_url, base.health_check_interval_s, base.server_pids, self.on_dead, log)
        async with aiohttp.ClientSession() as health_session:
            self.setup = asyncio.create_task(self._prepare(watchdog, points, health_session))
            try:
                await self.setup
            except asyncio.CancelledError:
                if self.interrupted is None:
                    raise
            finally:
                self.setup = None
            # Sessions run in this process: their prompts are built from the answers as they come.
            self.workers = 1 if base.sessions is not None else base.workers or default_workers(max(base.concurrency))
            if self.workers > 1 and self.interrupted is None:
                self.pool = WorkerPool(self.workers, base.url, base.endpoint == "chat")
                await self.pool.start()
                log(f"load generation: {self.workers} worker processes (pids {', '.join(map(str, self.pool.pids))})")
            # The sweep's bound counts from here: loading the tokenizer and starting the load
            # processes are bounded on their own.
            if base.total_timeout_s is not None:
                self.deadline = time.perf_counter() + base.total_timeout_s
            watcher = asyncio.create_task(watchdog.watch(health_session))
            try:
                if base.slo_search is not None:
                    outcomes = await self._search(points)
                else:
                    ran = 0
                    for pt in points:
                        self._use_shape(pt.shape)
                        if pt.kept:
                            outcomes.append(self._kept(pt))
                            continue
                        outcomes.append(await self._one(ran, pt.concurrency, pt.path))
                        ran += 1
            finally:
                watcher.cancel()
                if self.references is not None:
                    self.references.cancel()  # a sweep that ended before its first measured batch
                await asyncio.gather(watcher, *([self.references] if self.references else []), return_exceptions=True)
                for slot in self.slots:
                    slot.close()
                if self.pool is not None:
                    await self.pool.close()
        return outcomes

    # -- an SLO search over the ladder (benchmark.slo_search) ---------------------

    def _stopped(self) -> str | None:
        """Why the sweep runs no more points (the target died, Ctrl-C, the total timeout); None while it may."""
        if self.dead is not None or self.interrupted is not None:
            return self.dead or self.interrupted
        return self._total_reason() if time.perf_counter() >= self.deadline else None

    async def _search(self, points: list[_Point]) -> list[PointOutcome]:
        """The points the ladder asks for, then each SLO's best again (harness.bench.slo_ladder);
        slo_search.json after every step. The search is one shape (the config refuses several)."""
        base = self.base
        search = base.slo_search
        assert search is not None
        by_c = {pt.concurrency: pt for pt in points}
        self._use_shape(points[0].shape)
        ladder = Ladder(base.concurrency, list(search.slos), base.search_start)
        record = SearchRecord(Path(base.result_dir) / SLO_SEARCH, base.concurrency, search.slos, base.search_start)
        record.write()
        outcomes: list[PointOutcome] = []
        goodput: dict[int, float | None] = {}  # first measurements' goodput per device
        while (step := ladder.next()) is not None:
            pt = by_c[step.concurrency]
            outcome, verdicts, gpd = await self._search_point(pt, step.why, 0, record, len(outcomes))
            outcomes.append(outcome)
            if (why := self._stopped()) is not None:
                return self._search_stopped(outcomes, why)
            ladder.record(step.concurrency, {n: v.meets for n, v in verdicts.items()})
            goodput[step.concurrency] = gpd
        brackets = {name: ladder.bracket(name) for name in search.slos}
        record.brackets(brackets)
        for name, b in brackets.items():
            log(f"SLO search: {name}: best C={b.best}, first failing C={b.first_failing}")
        for c in dict.fromkeys(b.best for b in brackets.values() if b.best is not None):
            samples = [g for g in [goodput[c]] if g is not None]
            k = 0
            rule = search.repeats
            while (stop := repeats_stop(samples, k, rule.max, rule.ci_half_width, rule.confidence)) is None:
                k += 1
                outcome, _, gpd = await self._search_point(by_c[c], "repeat", k, record, len(outcomes))
                outcomes.append(outcome)
                if (why := self._stopped()) is not None:
                    record.repeats(c, samples, search.repeats.confidence, None)
                    return self._search_stopped(outcomes, why)
                if gpd is not None:
                    samples.append(gpd)
                record.repeats(c, samples, search.repeats.confidence, None)
            record.repeats(c, samples, search.repeats.confidence, stop)
            log(f"SLO search: C={c}: {k} repeat(s), stopped: {stop}")
        record.done()
        for c in base.concurrency:
            if c not in ladder.meets:
                above = c > max(ladder.meets)
                log(f"C={c}: not run: the SLO search {'stopped below it' if above else 'did not need it'}")
        return outcomes

    def _search_stopped(self, outcomes: list[PointOutcome], why: str) -> list[PointOutcome]:
        """The search ended before its end: slo_search.json keeps done false."""
        log(f"SLO search: stopped before its end ({why}); the points left are not run")
        return outcomes

    async def _search_point(
        self, pt: _Point, why: str, repeat: int, record: SearchRecord, index: int
    ) -> tuple[PointOutcome, dict[str, Verdict], float | None]:
        """One measurement of the search (repeat 0: the point's first, at the top of the run
        directory; k: under repeats/<k>/ with its own evidence), judged for every SLO and recorded."""
        search, c = self.base.slo_search, pt.concurrency
        assert search is not None
        path = pt.path if repeat == 0 else Path(self.base.result_dir) / repeat_subdir(repeat) / pt.path.name
        judged: dict[str, Any] = {}

        def annotate(result: BenchResult) -> None:
            data = result.model_dump(mode="json")
            judged["result"] = data
            verdicts = judge(search.slos, data)
            result.metadata["slo_search"] = {
                "repeat": repeat,
                "slos": {n: {"meets": v.meets, "violations": v.violations} for n, v in verdicts.items()},
            }

        if pt.kept if repeat == 0 else path.exists() and self._keeps(path, pt.shape, c):
            outcome = self._kept(_Point(pt.shape, c, path, True))
            judged["result"] = json.loads(path.read_text())
        else:
            log(f"C={c}: SLO search: {why}" + (f" {repeat}" if repeat else ""))
            outcome = await self._measure(index, c, path, repeat, annotate)
        result = judged.get("result") if outcome.path is not None else None
        verdicts = judge(search.slos, result)
        if result is not None or self._stopped() is None:  # a point the stop kept from running is no step
            file = str(path.relative_to(Path(self.base.result_dir))) if result is not None else None
            record.step(c, repeat, why, file, result, verdicts)
        return outcome, verdicts, goodput_per_device(result) if result is not None else None

    async def _measure(
        self, index: int, c: int, path: Path, repeat: int, annotate: Callable[[BenchResult], None]
    ) -> PointOutcome:
        """Run the point; a repeat's metrics and sentinels go under repeats/<k>/, its sentinel
        prompts its own (their reference answered first)."""
        if repeat == 0:
            return await self._one(index, c, path, annotate)
        base, shape_cfg = self.base, self.cfg
        where = repeat_subdir(repeat)
        self.repeat = repeat
        self.cfg = shape_cfg.model_copy(
            update={"metrics_dir": f"{where}/{base.metrics_dir}", "sentinels_dir": f"{where}/{base.sentinels_dir}"}
        )
        try:
            try:
                await self._repeat_sentinels(c)
            except Exception as e:  # the repeat runs all the same, its outputs unchecked
                self.sentinels.pop(point_tag(c, self.shape_tag), None)
                log(f"C={c}: repeat {repeat}: no sentinels: {type(e).__name__}: {e}")
            return await self._one(index, c, path, annotate)
        finally:
            self.repeat, self.cfg = 0, shape_cfg

    async def _repeat_sentinels(self, c: int) -> None:
        """A repeat's own sentinel prompts (the first measurement's would hit the prefix cache),
        answered by the reference before its warmups, in the repeat's reference.json."""
        reference, client = self.reference, self.sentinel_client
        m = self.cfg.sentinels.per_point(self.requests_for(c))
        tag = point_tag(c, self.shape_tag)
        if reference is None or client is None or not m or self._stopped() is not None:
            self.sentinels.pop(tag, None)
            return
        fresh = {tag: [Sentinel(i, r) for i, r in enumerate(self.sample(m, c, _SENTINEL))]}
        # Bounded per request; a first Ctrl-C ends the wait (the point is then not run).
        answering = asyncio.create_task(answer_references(client, reference, fresh, c))
        halt = asyncio.create_task(self.halt.wait())
        await asyncio.wait({answering, halt}, return_when=asyncio.FIRST_COMPLETED)
        halt.cancel()
        if not answering.done():
            answering.cancel()
            await asyncio.gather(answering, return_exceptions=True)
            return
        answering.result()
        self.sentinels |= fresh
        write_reference(Path(self.cfg.result_dir) / self.cfg.sentinels_dir / SENTINEL_REFERENCE, reference, fresh)

    def _plan_points(self) -> list[_Point]:
        """Every (shape, concurrency) point with its file; with resume, the complete ones are
        kept and the others' files set aside. Raises ResultExistsError without resume."""
        base = self.base
        result_dir = Path(base.result_dir)
        points = []
        for shape in base.shape_list():
            tag = shape.tag if base.multi_shape else None
            for c in base.concurrency:
                name = ResultName(c, base.request_rate, tag, base.prefill_gpus, base.decode_gpus, base.gpus).filename
                points.append(_Point(shape, c, result_dir / name))
        existing = [p for p in points if p.path.exists()]
        # An SLO search's record and repeats are results too. On resume the record is rebuilt (its
        # kept points count as measured), the earlier one set aside; a repeat is kept if complete.
        search = [result_dir / SLO_SEARCH, result_dir / REPEATS] if base.slo_search is not None else []
        records = [p for p in search if p.exists()]
        if (existing or records) and not base.resume:
            paths = ", ".join(str(p) for p in [*(p.path for p in existing), *records])
            raise ResultExistsError(f"result files already exist, not overwriting: {paths}")
        if base.resume and (record := result_dir / SLO_SEARCH) in records:
            log(f"resume: the SLO search starts again from the points kept; {record.name} was {set_aside(record)}")
        kept = {p.path for p in existing if self._keeps(p.path, p.shape, p.concurrency)}
        if base.resume and base.slo_search is not None:
            log(
                f"resume: {len(kept)} of {len(points)} ladder point(s) already done; the SLO search counts them measured"
            )
        elif base.resume:
            log(f"resume: {len(kept)} of {len(points)} point(s) already done, {len(points) - len(kept)} to run")
        return [_Point(p.shape, p.concurrency, p.path, p.path in kept) for p in points]

    def _keeps(self, path: Path, shape: Shape, concurrency: int) -> bool:
        """Resume: whether PATH holds this point complete; if not, it is set aside to be run again."""
        why = why_not_kept(
            path,
            shape.isl,
            shape.osl,
            concurrency,
            self.requests_for(concurrency),
            self.base.model,
            trace=replay_of(self.base, self.trace),
        )
        if why is None:
            return True
        moved = set_aside(path)
        log(f"resume: {path.name} is run again ({why}); the earlier file is now {moved}")
        return False

    def _kept(self, pt: _Point) -> PointOutcome:
        result = BenchResult.model_validate_json(pt.path.read_text())
        log(f"C={pt.concurrency}{self._shape_text()}: kept from an earlier run -> {pt.path.name}")
        return PointOutcome(pt.concurrency, pt.path, result.completed, result.failed, None, self.shape_tag, True)

    def _client_section(self, concurrency: int) -> dict[str, Any]:
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
        if warnings:
            for w in warnings:
                log(f"C={concurrency}{self._shape_text()}: WARNING: {w}")
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

    def _shape_text(self) -> str:
        return f" {self.cfg.isl}/{self.cfg.osl}" if self.shape_tag else ""

    def _not_run(self, c: int) -> PointOutcome | None:
        """The outcome of a point the sweep no longer runs; None while it may."""
        if self.dead is not None:
            return PointOutcome(c, None, error=f"not run: {self.dead}", shape=self.shape_tag)
        if self.interrupted is not None:
            return PointOutcome(c, None, error=f"not run: {self.interrupted}", shape=self.shape_tag, interrupted=True)
        if time.perf_counter() >= self.deadline:
            return PointOutcome(c, None, error=f"not run: {self._total_reason()}", shape=self.shape_tag)
        return None

    def _unwritten(self, c: int, path: Path, result: BenchResult, e: OSError) -> PointOutcome:
        """The point was measured but its file cannot be written (a disk that filled or went
        read-only mid-run): its result goes to a spare file under the temporary directory, or,
        if that fails too, it is lost; the error says which. The sweep stops: the next points'
        results could not be written either."""
        why = f"cannot write {e.filename or path}: {e.strerror or e}"
        try:
            kept = f"the point's result was written to {write_spare(result, path)} instead"
        except OSError as e2:
            kept = f"the point's result is lost (nor could it be written under the temporary directory: {e2})"
        error = f"{why}; {kept}"
        log(f"C={c}{self._shape_text()}: {error}")
        self.dead = f"results cannot be written ({why})"
        return PointOutcome(c, None, result.completed, result.failed, error, self.shape_tag)

    async def _one(
        self, index: int, c: int, path: Path, annotate: Callable[[BenchResult], None] | None = None
    ) -> PointOutcome:
        """Run and write one point; `annotate` adds to its result before it is written."""
        cfg, tag = self.cfg, self.shape_tag
        if (skipped := self._not_run(c)) is not None:
            return skipped
        if index and cfg.cooldown_s:
            # A first Ctrl-C ends the cooldown.
            pause = max(0.0, min(cfg.cooldown_s, self.deadline - time.perf_counter()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.halt.wait(), pause)
        if (skipped := self._not_run(c)) is not None:
            return skipped
        label = f"C={c}{self._shape_text()}"
        result: BenchResult | str | None = None
        try:
            result = await self.point(c)
            if isinstance(result, str):
                log(f"{label}: no result: {result}")
                return PointOutcome(c, None, error=result, shape=tag, interrupted=self.interrupted is not None)
            if annotate is not None:
                annotate(result)
            path = write_result(result, path)
        except ResultExistsError as e:
            log(f"{label}: point could not be written: {e}")
            return PointOutcome(c, None, error=str(e), shape=tag)
        except OSError as e:
            if not isinstance(result, BenchResult):  # raised while the point ran: nothing to keep
                log(f"{label}: point could not be run: {type(e).__name__}: {e}")
                return PointOutcome(c, None, error=f"{type(e).__name__}: {e}", shape=tag)
            return self._unwritten(c, path, result, e)
        except Exception as e:
            log(f"{label}: point could not be run: {type(e).__name__}: {e}")
            return PointOutcome(c, None, error=f"{type(e).__name__}: {e}", shape=tag)
        latencies = (
            f"median TTFT {result.median_ttft_ms:.1f} ms, "
            f"median TPOT {getattr(result, 'median_tpot_ms', 0.0):.2f} ms, "  # absent when 0
            if result.median_ttft_ms is not None
            else "latencies n/a (no request completed), "
        )
        log(
            f"{label}: completed {result.completed}, failed {result.failed}, {latencies}"
            f"output {result.output_throughput:.1f} tok/s, {result.request_throughput:.1f} req/s"
            + (f", {self.unsent} never sent" if self.unsent else "")
            + (f", stopped: {result.stop_reason}" if result.stop_reason else "")
            + f" -> {path.name}"
        )
        error = (
            result.stop_reason if result.stop_reason and not result.stop_reason.startswith("point timeout") else None
        )
        return PointOutcome(c, path, result.completed, result.failed, error, tag, interrupted=error == INTERRUPTED)


def _metadata(cfg: ClientConfig) -> dict[str, Any]:
    """The config's metadata (a recipe's run metadata wins), plus what the bench itself knows:
    its version and the GPU split behind the target, or that the split is unknown."""
    md: dict[str, Any] = {"pdbench_version": __version__}
    if cfg.disagg:
        md |= {"disagg": True, "prefill_gpus": cfg.prefill_gpus, "decode_gpus": cfg.decode_gpus}
    elif cfg.gpus is not None:
        md |= {"disagg": False, "gpus": cfg.gpus}
    else:
        md |= {"disagg": False, "gpu_split": "unknown"}
    return md | cfg.metadata


def run_sweep_detailed(config: ClientConfig) -> list[PointOutcome]:
    """Run every point; per-point outcomes tell the caller what failed.

    Raises ResultExistsError (a result file is there), TargetDied (the target is down
    before any load), DatasetError, or the tokenizer's error; nothing was sent then.
    """
    return aio.run(_Sweep(config).run())


def run_sweep(config: ClientConfig) -> list[Path]:
    """Run every point and return the result files written, in concurrency order."""
    return [o.path for o in run_sweep_detailed(config) if o.path is not None]
