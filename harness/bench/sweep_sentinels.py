"""A sweep's sentinels (harness.bench.sentinels): every point's greedy prompts drawn before the
sweep, the reference's answers to them (beside the first point's warm-ups), each point's prompts
sent beside its measured requests and compared, and an SLO search repeat's prompts of its own."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from harness.bench.client_config import ClientConfig
from harness.bench.loadgen import Progress
from harness.bench.points import Point
from harness.bench.progress import log
from harness.bench.scope import SENTINEL, Scope
from harness.bench.sentinels import (
    PointSentinels,
    Reference,
    Sentinel,
    SentinelClient,
    answer_references,
    write_reference,
)
from harness.bench.stops import Stops
from harness.bench.workloads import Workload
from harness.rundir.paths import SENTINEL_REFERENCE, sentinel_record_name
from harness.validity.outputs import OutputsCheck


class SweepSentinels:
    def __init__(self, base: ClientConfig, stops: Stops, workload: Workload) -> None:
        self.base = base
        self.stops = stops
        self.workload = workload
        self.sentinels: dict[str, list[Sentinel]] = {}  # by point tag, answered by the reference before the sweep
        self.reference: Reference | None = None
        self.client: SentinelClient | None = None
        self.answers: asyncio.Task[None] | None = None  # the reference answers, beside the first warmups

    def plan(self, points: list[Point], session: aiohttp.ClientSession) -> bool:
        """Sample every point's sentinels; True when a reference is there to answer them."""
        base, workload = self.base, self.workload
        if not any(base.sentinels.per_point(workload.requests(base, c)) for c in base.concurrency):
            return False
        self.reference = Reference.of(base)
        if self.reference is None:
            role = base.sentinels.reference
            log(f"sentinels: no reference instance (no {role} or aggregated --scrape target): outputs not checked")
            return False
        for pt in points:
            if pt.kept:
                continue
            scope = Scope.of_shape(base, pt.shape)
            m = scope.cfg.sentinels.per_point(workload.requests(scope.cfg, pt.concurrency))
            reqs = workload.sample(scope.cfg, m, scope.rng(pt.concurrency, SENTINEL))
            self.sentinels[scope.tag(pt.concurrency)] = [Sentinel(i, r) for i, r in enumerate(reqs)]
        self.client = SentinelClient(base, session)
        return bool(self.sentinels)

    def start_answers(self) -> None:
        self.answers = asyncio.create_task(self._answer_references())

    async def _answer_references(self) -> None:
        """The reference answers every sentinel of the sweep, all at once up to the highest
        concurrency. It runs beside the load processes' start and the first point's warmups
        (unmeasured), and the first measured batch waits for it (ready)."""
        base, reference, client = self.base, self.reference, self.client
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

    async def ready(self) -> None:
        """Before a measured batch: the reference answers are in (each request is bounded), or a
        Ctrl-C came (the batch then sends nothing)."""
        task = self.answers
        if task is None:
            return
        if not task.done():
            log("sentinels: waiting for the reference answers before the measured requests")
            halt = asyncio.create_task(self.stops.halt.wait())
            await asyncio.wait({task, halt}, return_when=asyncio.FIRST_COMPLETED)
            halt.cancel()
        if task.done():
            task.result()  # a failure to write reference.json is the point's

    async def close(self) -> None:
        """A sweep that ended before its first measured batch leaves the answers unwaited."""
        if self.answers is not None:
            self.answers.cancel()
            await asyncio.gather(self.answers, return_exceptions=True)

    def for_point(self, scope: Scope, concurrency: int, measured: int, progress: Progress) -> PointSentinels | None:
        sentinels = self.sentinels.get(scope.tag(concurrency))
        if not sentinels or self.reference is None or self.client is None:
            return None
        return PointSentinels(self.client, scope.cfg.url, sentinels, measured, concurrency, progress)

    def outputs_check(self, scope: Scope, concurrency: int, sentinels: PointSentinels | None) -> OutputsCheck | None:
        """The point's sentinel comparison; None when sentinels are off."""
        tol = scope.cfg.sentinels
        m = tol.per_point(self.workload.requests(scope.cfg, concurrency))
        if not m:
            return None
        if sentinels is None:
            why = f"no reference instance: give the client a {tol.reference} or aggregated --scrape target"
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

    def record(self, scope: Scope, concurrency: int, sentinels: PointSentinels, check: OutputsCheck) -> dict[str, Any]:
        """Writes the point's sentinel record; returns the result's `sentinels` section."""
        assert self.reference is not None
        tag = scope.tag(concurrency)
        record = Path(scope.cfg.sentinels_dir) / sentinel_record_name(tag)
        sentinels.write_record(Path(scope.cfg.result_dir) / record, tag, self.reference.description, check)
        summary = sentinels.summary(check, self.reference.description, str(record))
        # Counted as it reads: how many matched when all did, else how many diverged.
        if check.matched == check.compared:
            said = f"{check.matched} of {check.compared} compared matched"
        else:
            said = f"{check.compared - check.matched} of {check.compared} compared DIVERGED from"
        log(f"{scope.label(concurrency)}: sentinels: {said} the reference ({check.sent} sent)")
        return summary.model_dump(mode="json")

    async def for_repeat(self, scope: Scope, concurrency: int) -> None:
        """A repeat's own sentinel prompts (the first measurement's would hit the prefix cache),
        answered by the reference before its warmups, in the repeat's reference.json. Without
        them (an error, a Ctrl-C) the repeat runs all the same, its outputs unchecked."""
        try:
            await self._for_repeat(scope, concurrency)
        except Exception as e:
            self.sentinels.pop(scope.tag(concurrency), None)
            log(f"C={concurrency}: repeat {scope.repeat}: no sentinels: {type(e).__name__}: {e}")

    async def _for_repeat(self, scope: Scope, c: int) -> None:
        reference, client, cfg = self.reference, self.client, scope.cfg
        m = cfg.sentinels.per_point(self.workload.requests(cfg, c))
        tag = scope.tag(c)
        if reference is None or client is None or not m or self.stops.stopped() is not None:
            self.sentinels.pop(tag, None)
            return
        fresh = {tag: [Sentinel(i, r) for i, r in enumerate(self.workload.sample(cfg, m, scope.rng(c, SENTINEL)))]}
        # Bounded per request; a first Ctrl-C ends the wait (the point is then not run).
        answering = asyncio.create_task(answer_references(client, reference, fresh, c))
        halt = asyncio.create_task(self.stops.halt.wait())
        await asyncio.wait({answering, halt}, return_when=asyncio.FIRST_COMPLETED)
        halt.cancel()
        if not answering.done():
            answering.cancel()
            await asyncio.gather(answering, return_exceptions=True)
            return
        answering.result()
        self.sentinels |= fresh
        write_reference(Path(cfg.result_dir) / cfg.sentinels_dir / SENTINEL_REFERENCE, reference, fresh)
