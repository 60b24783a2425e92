"""Run a concurrency sweep: for each point, warm-ups then the measured requests.

The sweep is a pipeline of small pieces, composed here:

- the workload (harness.bench.workloads, chosen from `dataset`): what a point sends and when:
  independent requests (random or from a file) at the request rate, multi-turn sessions, or a
  Mooncake trace at its timestamps;
- the points (harness.bench.points): every (shape, concurrency) with its file, and which ones a
  resumed sweep keeps;
- the sentinels (harness.bench.sweep_sentinels): greedy prompts answered by a reference before
  the sweep and checked at each point;
- the load runner (harness.bench.load_runner): the connections and load processes that send a
  window and time it;
- the point runner (harness.bench.point_runner): one point, from its warm-ups to its file;
- the stop rules (harness.bench.stops): a dead target (the watchdog, harness.bench.watchdog),
  Ctrl-C, the total timeout, an early invalid point, failed warm-ups;
- the driver: the points in order, or up the SLO ladder (harness.bench.slo_driver).

When the target dies the running batch stops at once, its finished requests are kept (the
point's file is written with `stop_reason`), and the points left are not run; `total_timeout_s`
ends a sweep the same way. A first Ctrl-C (SIGINT) sends no more requests, waits at most
`interrupt_grace_s` for those in flight, writes the point so far with `stop_reason` INTERRUPTED
(its sentinels finished and recorded) and runs no more points; a second one cancels the
requests in flight at once.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path

import aiohttp

from harness import aio
from harness.bench.client_config import ClientConfig
from harness.bench.load_runner import LoadRunner
from harness.bench.loadgen import arrival_offsets
from harness.bench.point_runner import PointOutcome, PointRunner
from harness.bench.points import Point, PointPlan
from harness.bench.progress import log, pick_mode
from harness.bench.results import check_writable
from harness.bench.runtime_info import runtime_metadata
from harness.bench.scope import Scope
from harness.bench.slo_driver import SloDriver
from harness.bench.stops import INTERRUPTED, Stops
from harness.bench.sweep_sentinels import SweepSentinels
from harness.bench.tokenizer import load_tokenizer
from harness.bench.watchdog import TargetDied, Watchdog
from harness.bench.workloads import workload_for
from harness.rundir.kv_ceiling import read as read_kv_ceiling
from harness.rundir.paths import KV_CEILING

__all__ = ["INTERRUPTED", "PointOutcome", "TargetDied", "arrival_offsets", "run_sweep", "run_sweep_detailed"]


class _Sweep:
    def __init__(self, cfg: ClientConfig) -> None:
        self.base = cfg
        self.stops = Stops(cfg)
        self.workload = workload_for(cfg)
        self.plan = PointPlan(cfg, self.workload)
        self.sentinels = SweepSentinels(cfg, self.stops, self.workload)
        self.load = LoadRunner(cfg, self.stops, pick_mode(cfg.progress))
        self.runner = PointRunner(self.stops, self.load, self.workload, self.sentinels)

    async def run(self) -> list[PointOutcome]:
        """The sweep, with Ctrl-C handled by the stop rules while it runs (in the main thread only:
        elsewhere the embedding program owns SIGINT)."""
        loop = asyncio.get_running_loop()
        ours = threading.current_thread() is threading.main_thread()
        if ours:
            loop.add_signal_handler(signal.SIGINT, self.stops.on_interrupt)
        self.stops.main = asyncio.current_task()
        try:
            return await self._run()
        except asyncio.CancelledError:
            if self.stops.interrupts < 2:
                raise
            raise KeyboardInterrupt from None
        finally:
            if ours:
                loop.remove_signal_handler(signal.SIGINT)

    async def _prepare(self, watchdog: Watchdog, points: list[Point], session: aiohttp.ClientSession) -> None:
        """What comes before the first point; a first Ctrl-C cancels it. The reference answers
        start here and go on beside the first point's warmups."""
        base, runner = self.base, self.runner
        await watchdog.preflight(session)  # raises TargetDied: nothing was sent
        runner.runtime = await runtime_metadata(base, log)
        if base.runtime_records_dir:  # the node measured it before starting this client
            runner.kv_ceiling = read_kv_ceiling(Path(base.result_dir) / base.runtime_records_dir / KV_CEILING)
            if base.kv_connector is not None and runner.kv_ceiling is not None:
                log(f"KV ceiling: {runner.kv_ceiling.describe()}")
        if self.sentinels.plan(points, session):
            self.sentinels.start_answers()

    async def _run(self) -> list[PointOutcome]:
        base, stops = self.base, self.stops
        # Fail before sending any load rather than after a long point: a result directory that
        # cannot take a file (read-only, full, no permission); the workload's files (a trace's
        # length is every point's request count, which resume checks).
        check_writable(Path(base.result_dir))
        self.workload.load(base)
        points = self.plan.points()
        if not base.scrape:
            log("no scrape targets: every point is recorded unverified (metadata.valid null)")
        tokenizer = self.load.tokenizer = load_tokenizer(base.tokenizer)
        self.workload.start(base, tokenizer)

        outcomes: list[PointOutcome] = []
        watchdog = Watchdog(base.base_url, base.health_check_interval_s, base.server_pids, stops.on_dead, log)
        async with aiohttp.ClientSession() as health_session:
            stops.setup = asyncio.create_task(self._prepare(watchdog, points, health_session))
            try:
                await stops.setup
            except asyncio.CancelledError:
                if stops.interrupted is None:
                    raise
            finally:
                stops.setup = None
            await self.load.start(self.workload.in_workers)
            # The sweep's bound counts from here: loading the tokenizer and starting the load
            # processes are bounded on their own.
            stops.start_clock()
            watcher = asyncio.create_task(watchdog.watch(health_session))
            try:
                if base.slo_search is not None:
                    driver = SloDriver(base, stops, self.runner, self.plan, self.sentinels)
                    outcomes = await driver.run(points)
                else:
                    outcomes = await self._in_order(points)
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, self.sentinels.close(), return_exceptions=True)
                await self.load.close()
        return outcomes

    async def _in_order(self, points: list[Point]) -> list[PointOutcome]:
        """Every point in order, the ones a resume kept read back."""
        outcomes: list[PointOutcome] = []
        ran = 0
        for pt in points:
            scope = Scope.of_shape(self.base, pt.shape)
            if pt.kept:
                outcomes.append(self.runner.kept(scope, pt))
                continue
            outcomes.append(await self.runner.run(scope, ran, pt.concurrency, pt.path))
            ran += 1
        return outcomes


def run_sweep_detailed(config: ClientConfig) -> list[PointOutcome]:
    """Run every point; per-point outcomes tell the caller what failed.

    Raises ResultExistsError (a result file is there), TargetDied (the target is down
    before any load), DatasetError, or the tokenizer's error; nothing was sent then.
    """
    return aio.run(_Sweep(config).run())


def run_sweep(config: ClientConfig) -> list[Path]:
    """Run every point and return the result files written, in concurrency order."""
    return [o.path for o in run_sweep_detailed(config) if o.path is not None]
