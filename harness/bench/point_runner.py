"""Run one point: its warm-ups, its sentinels beside the measured window, its /metrics evidence and
validity verdict, an optional profiled window, and its result file.

What the windows send is the workload's (harness.bench.workloads); how they are sent and timed
the load runner's; when they stop the stop rules' (harness.bench.stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from harness import __version__
from harness.bench.client import RequestOutput
from harness.bench.client_config import ClientConfig
from harness.bench.load_runner import LoadRunner
from harness.bench.loadgen import Progress
from harness.bench.points import Point
from harness.bench.prediction_check import with_prediction
from harness.bench.profile import PointProfiler, perturbation, window_figures
from harness.bench.progress import log
from harness.bench.results import BenchResult, ResultExistsError, write_result, write_spare
from harness.bench.scope import MAIN, PROFILE, Scope
from harness.bench.serve_metrics import compute_metrics
from harness.bench.stops import INTERRUPTED, WARMUPS_FAILED, Stops
from harness.bench.sweep_sentinels import SweepSentinels
from harness.bench.ttft_breakdown import judge_point, kv_transfer_ms, read_role_timings, ttft_breakdown
from harness.bench.validity_probe import PointProbe, parse_target
from harness.bench.workloads import Window, Workload
from harness.rundir.bottleneck_summary import Baseline
from harness.rundir.kv_ceiling import KvCeiling
from harness.rundir.profile_summary import ProfileSummary, ServerTraces, WindowFigures
from harness.rundir.proxy_timings import read_all as read_timings
from harness.validity import ClientCounts, unverified
from harness.validity.completed import with_completed
from harness.validity.kv_handoff import describe as describe_handoff
from harness.validity.kv_handoff import point_handoff
from harness.validity.kv_transport import judge as judge_transport
from harness.validity.kv_transport import with_kv_transport
from harness.validity.outputs import with_outputs_check

# How long a point waits for the proxy's timing records of its completed requests.
PROXY_RECORDS_WAIT_S = 2.0


@dataclass
class PointOutcome:
    concurrency: int
    path: Path | None  # None when the point could not be run or written
    completed: int = 0
    failed: int = 0  # sent and not successful
    error: str | None = None
    shape: str | None = None  # isl_<I>_osl_<O> in a several-shape sweep
    kept: bool = False  # resumed: the result of an earlier run, not run again
    interrupted: bool = False  # cut short or not run because of a Ctrl-C
    not_sent: int = 0  # measured requests a stop kept from being sent

    @property
    def ok(self) -> bool:
        return self.path is not None and self.failed == 0 and self.not_sent == 0 and self.error is None

    def counts(self) -> str:
        """The point's request counts in words, e.g. "12 completed, 0 failed, 28 never sent"."""
        return f"{self.completed} completed, {self.failed} failed" + (
            f", {self.not_sent} never sent" if self.not_sent else ""
        )


def metadata(cfg: ClientConfig) -> dict[str, Any]:
    """The config's metadata (a recipe's run metadata wins), plus what the bench itself knows:
    its version and the GPU split behind the target, or that the split is unknown."""
    md: dict[str, Any] = {"pdbench_version": __version__, "request_options": cfg.request_record()}
    if cfg.disagg:
        md |= {"disagg": True, "prefill_gpus": cfg.prefill_gpus, "decode_gpus": cfg.decode_gpus}
    elif cfg.gpus is not None:
        md |= {"disagg": False, "gpus": cfg.gpus}
    else:
        md |= {"disagg": False, "gpu_split": "unknown"}
    return md | cfg.metadata


def server_logs(cfg: ClientConfig) -> Path | None:
    """Where the scraped servers' logs lie (NIXL's lane is read from decode's), if given."""
    return Path(cfg.result_dir) / cfg.server_logs_dir if cfg.server_logs_dir else None


class PointRunner:
    def __init__(
        self,
        stops: Stops,
        load: LoadRunner,
        workload: Workload,
        sentinels: SweepSentinels,
    ) -> None:
        self.stops = stops
        self.load = load
        self.workload = workload
        self.sentinels = sentinels
        self.runtime: dict[str, Any] = {}  # what the servers ran (runtime_info), in every result
        self.kv_ceiling: KvCeiling | None = None  # the job's KV ceiling (state/kv_ceiling.json); None outside a job
        self.bottleneck_bases: dict[str | None, Baseline] = {}  # per shape: the bottleneck's growth baseline

    # -- a point's outcome --------------------------------------------------------

    def not_run(self, scope: Scope, c: int) -> PointOutcome | None:
        """The outcome of a point the sweep no longer runs; None while it may."""
        stops = self.stops
        if (why := stops.stopped()) is None:
            return None
        interrupted = stops.dead is None and stops.interrupted is not None
        return PointOutcome(c, None, error=f"not run: {why}", shape=scope.shape_tag, interrupted=interrupted)

    def kept(self, scope: Scope, pt: Point) -> PointOutcome:
        result = BenchResult.model_validate_json(pt.path.read_text())
        log(f"{scope.label(pt.concurrency)}: kept from an earlier run -> {pt.path.name}")
        return PointOutcome(
            pt.concurrency,
            pt.path,
            result.completed,
            result.failed,
            None,
            scope.shape_tag,
            True,
            not_sent=result.not_sent,
        )

    def _unwritten(self, scope: Scope, c: int, path: Path, result: BenchResult, e: OSError) -> PointOutcome:
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
        log(f"{scope.label(c)}: {error}")
        self.stops.on_unwritable(why)
        return PointOutcome(c, None, result.completed, result.failed, error, scope.shape_tag, not_sent=result.not_sent)

    async def run(
        self, scope: Scope, index: int, c: int, path: Path, annotate: Callable[[BenchResult], None] | None = None
    ) -> PointOutcome:
        """Run and write one point (`index`: how many ran before it); `annotate` adds to its
        result before it is written."""
        cfg, tag, stops = scope.cfg, scope.shape_tag, self.stops
        if (skipped := self.not_run(scope, c)) is not None:
            return skipped
        if index and cfg.cooldown_s:
            # A first Ctrl-C ends the cooldown.
            pause = max(0.0, min(cfg.cooldown_s, stops.deadline - time.perf_counter()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stops.halt.wait(), pause)
        if (skipped := self.not_run(scope, c)) is not None:
            return skipped
        label = scope.label(c)
        result: BenchResult | str | None = None
        try:
            result = await self.point(scope, c)
            if isinstance(result, str):
                log(f"{label}: no result: {result}")
                return PointOutcome(c, None, error=result, shape=tag, interrupted=stops.interrupted is not None)
            if annotate is not None:
                annotate(result)
            with_prediction(result, Path(cfg.result_dir))
            path = write_result(result, path)
        except ResultExistsError as e:
            log(f"{label}: point could not be written: {e}")
            return PointOutcome(c, None, error=str(e), shape=tag)
        except OSError as e:
            if not isinstance(result, BenchResult):  # raised while the point ran: nothing to keep
                log(f"{label}: point could not be run: {type(e).__name__}: {e}")
                return PointOutcome(c, None, error=f"{type(e).__name__}: {e}", shape=tag)
            return self._unwritten(scope, c, path, result, e)
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
            + (f", {result.not_sent} never sent" if result.not_sent else "")
            + (f", stopped: {result.stop_reason}" if result.stop_reason else "")
            + f" -> {path.name}"
        )
        error = (
            result.stop_reason if result.stop_reason and not result.stop_reason.startswith("point timeout") else None
        )
        return PointOutcome(
            c,
            path,
            result.completed,
            result.failed,
            error,
            tag,
            interrupted=error == INTERRUPTED,
            not_sent=result.not_sent,
        )

    # -- the point itself ------------------------------------------------------------

    async def _warmups(self, scope: Scope, c: int) -> str | None:
        """The point's warm-ups, all at once up to C, left out of the metrics; why the point
        has no result when they end it, else None."""
        cfg, stops = scope.cfg, self.stops
        n_warm = cfg.num_warmups_for(c)
        if not n_warm:
            return None
        window = self.workload.warmups(cfg, c, lambda stream: scope.rng(c, stream))
        label = f"{scope.label(c)} warmup"
        sent = await window.send(self.load, label, c, cfg.point_timeout_for(n_warm, c), None)
        if sent.stopped is not None and stops.ends_point(sent.stopped):
            return f"stopped during warmups: {sent.stopped}"
        if bad := [o for o in sent.outs if not o.success]:
            log(f"{scope.label(c)}: {len(bad)}/{n_warm} warmup requests failed: {bad[0].error}")
            if len(bad) == len(sent.outs):
                # A wrong model name, a server that refuses every request: the measured
                # requests would fail the same way. Neither they nor the points left are sent.
                why = f"{WARMUPS_FAILED} (model {cfg.model!r} at {cfg.url}): {bad[0].error}"
                stops.on_warmups_failed(why)
                return why
        return None

    def _window(self, scope: Scope, c: int, stream: int) -> tuple[Window, float]:
        """A window of the point's requests (the measured one: stream MAIN; the profiled one:
        PROFILE), drawn now, before any clock, and its time bound (a replay lasts at least the
        trace's span over its speed)."""
        cfg = scope.cfg
        window = self.workload.window(cfg, c, lambda s: scope.rng(c, s), stream)
        return window, cfg.point_timeout_for(self.workload.requests(cfg, c), c) + window.span_s

    async def _proxy_records(self, directory: Path, outs: list[RequestOutput]) -> dict[str, dict[str, Any]]:
        """The proxy's timing records of this batch. The proxy writes a request's record just after
        the response's last byte, which the client may have read first: wait (bounded) for the
        records of the completed requests."""
        request_ids = self.load.request_ids
        ids = set(request_ids)
        done = {rid for rid, o in zip(request_ids, outs, strict=False) if o.success}
        deadline = time.monotonic() + PROXY_RECORDS_WAIT_S
        records = read_timings(directory, ids)
        while not done <= records.keys() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            records = read_timings(directory, ids)
        return records

    async def point(self, scope: Scope, concurrency: int) -> BenchResult | str:
        """The point's result, or why it has none (stopped during its warmups)."""
        cfg, stops, workload = scope.cfg, self.stops, self.workload
        label = scope.label(concurrency)
        n = workload.requests(cfg, concurrency)
        if self.load.mode == "plain":
            log(f"{label}: {workload.describe(cfg, concurrency)}")
        measured, limit = self._window(scope, concurrency, MAIN)
        if (why := await self._warmups(scope, concurrency)) is not None:
            return why

        await self.sentinels.ready()
        date = datetime.now().strftime("%Y%m%d-%H%M%S")
        wall_offset = time.time() - time.perf_counter()  # request times are perf_counter
        probe = None
        if cfg.scrape:
            probe = PointProbe(
                cfg.scrape,
                Path(cfg.result_dir) / cfg.metrics_dir / scope.tag(concurrency),
                cfg.validity,
                cfg.kv_connector,
                completed=lambda: stops.progress.done - stops.progress.failed,
                kv_ceiling=self.kv_ceiling,
                on_invalid=lambda why: stops.on_invalid(label, concurrency, why),
                logs_dir=server_logs(cfg),
            )
            await probe.start()
        profiler = self._profiler(scope, concurrency)
        # perturbation false: the measured window itself is profiled (else a second window is, below).
        in_window = profiler if profiler is not None and not profiler.settings.perturbation else None
        if in_window is not None:
            stops.now_profiling(in_window)
            await in_window.start()  # a refusal is in its server's entry; the point runs all the same
        progress = Progress()
        sentinels = stops.point_sentinels = self.sentinels.for_point(scope, concurrency, n, progress)
        if sentinels is not None:
            sentinels.start()
        sent = await measured.send(self.load, label, concurrency, limit, progress)
        outs, stopped = sent.outs, sent.stopped
        if sentinels is not None:
            # After a Ctrl-C the sentinels still out are not waited for, even if the batch ended.
            await sentinels.finish(stopped is not None or stops.interrupted is not None)
            stops.point_sentinels = None
        traces = await in_window.stop() if in_window is not None else None
        stops.now_profiling(None)
        on_wire = [o for o in outs if o.sent]
        if stops.interrupted is not None and not on_wire:
            if probe is not None:
                await probe.cancel()
            return f"{INTERRUPTED} before its measured requests were sent"
        s_prompt, s_output, s_ok, s_failed = sentinels.counts() if sentinels is not None else (0, 0, 0, 0)
        backend = "openai-chat" if cfg.endpoint == "chat" else "openai"
        md = metadata(cfg) | self.runtime
        if probe is not None:
            # Requests never sent are no one's failure: the servers did not see them.
            failed = sum(not o.success for o in on_wire) + s_failed
            if stops.interrupted is not None:
                # A Ctrl-C is the user's stop, not the servers' failure: the requests it cancelled
                # in flight do not count as failed (a timeout's or a dead target's do).
                failed -= sum(not o.success and (o.error or "").startswith(INTERRUPTED) for o in on_wire)
                failed -= sentinels.cancelled() if sentinels is not None else 0
            # The servers saw the sentinels too: their requests and tokens count here.
            verdict = await probe.finish(
                ClientCounts(
                    prompt_tokens=sum(o.prompt_len for o in on_wire) + s_prompt,
                    output_tokens=sum(o.output_tokens for o in on_wire) + s_output,
                    completed=sum(o.success for o in outs) + s_ok,
                    failed=failed,
                )
            )
        else:
            verdict = unverified("no server /metrics were scraped (no scrape targets given)")
        extra: dict[str, Any] = {}
        check = self.sentinels.outputs_check(scope, concurrency, sentinels)
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
            server_logs(cfg),
        )
        if probe is not None and cfg.kv_connector is not None and probe.disaggregated:
            # How the KV moved, from the connector's own account, against the job's ceiling.
            transport, handoff = judge_transport(handoff, self.kv_ceiling, cfg.validity, cfg.kv_connector)
            verdict = with_kv_transport(verdict, transport)
        if handoff is not None:
            extra["kv_handoff"] = handoff.model_dump(mode="json")
            log(f"{label}: {describe_handoff(handoff)}")
        if probe is not None and probe.prefix_cache is not None:
            extra["prefix_cache"] = probe.prefix_cache.model_dump(mode="json")
        if sentinels is not None and check is not None:
            extra["sentinels"] = self.sentinels.record(scope, concurrency, sentinels, check)
        extra |= workload.sections(cfg, concurrency, sent, check, sentinels is not None)
        # valid: true / false / null (unverified); the verdict and its evidence under validity.
        md.update(valid=verdict.valid, validity=verdict.model_dump(mode="json"))
        if probe is not None and verdict.verdict != "valid":
            log(f"{label}: {verdict.verdict.upper()} point: {'; '.join(verdict.reasons)}")
        metrics = compute_metrics(outs, cfg.percentiles, {str(k): v for k, v in cfg.goodput.items()})
        extra["client"] = self.load.client_section(label)
        kv = kv_transfer_ms(verdict if probe is not None else None, cfg.kv_connector)
        servers = read_role_timings(probe.targets, probe.out_dir) if probe is not None else {}
        if cfg.proxy_timings_dir:
            extra["ttft_breakdown"] = ttft_breakdown(outs, self.load.request_ids, records, kv, servers)
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
                scope.shape_tag,
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
                extra["profile"] = await self._profiled_window(scope, profiler, concurrency, stopped, figures)
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
            metadata=md,
            **metrics,
            **extra,
        )

    # -- profiles (benchmark.profile) ---------------------------------------------

    def _profiler(self, scope: Scope, concurrency: int) -> PointProfiler | None:
        """The point's profiler when it is one of profile.points (an SLO search's repeats are not)
        and servers of the profiled roles are among the scrape targets (a job's aggregated baseline
        has none of prefill's and decode's)."""
        prof = scope.cfg.profile
        if prof is None or concurrency not in prof.points or scope.repeat:
            return None
        targets = [parse_target(t) for t in scope.cfg.scrape]
        profiler = PointProfiler(prof, targets, Path(scope.cfg.result_dir), scope.tag(concurrency), log)
        if not profiler.servers:
            scraped = ", ".join(f"{name} ({role})" for name, role, _ in targets) or "none"
            log(
                f"{scope.label(concurrency)}: not profiled: no server of the profiled role(s) "
                f"{', '.join(prof.roles)} among the scrape targets ({scraped})"
            )
            return None
        return profiler

    async def _profiled_window(
        self,
        scope: Scope,
        profiler: PointProfiler,
        concurrency: int,
        stopped: str | None,
        unprofiled: WindowFigures,
    ) -> ProfileSummary:
        """After the point's measured window: the same number of requests of the same shape, rate
        and arrival times (prompts of their own), profiled. Not run when the measured window or the
        sweep stopped, or no server's profiler started; the section then says why."""
        cfg, stops = scope.cfg, self.stops
        label, tool = f"{scope.label(concurrency)} profiled", profiler.settings.tool

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

        if (why := stopped or stops.stopped()) is not None:
            return not_run(f"the measured window stopped ({why})", [])
        window, limit = self._window(scope, concurrency, PROFILE)  # drawn before the profiler runs
        stops.now_profiling(profiler)
        try:
            if not await profiler.start():
                return not_run("no server's profiler started", profiler.refused())
            try:
                sent = await window.send(self.load, label, concurrency, limit, None)
            except asyncio.CancelledError:
                raise  # a second Ctrl-C: the job stops its servers now; no trace is waited for
            except Exception:
                await profiler.stop()  # a profiler left on would refuse the next point's start
                raise
            traces = await profiler.stop()
        finally:
            stops.now_profiling(None)
        metrics = compute_metrics(sent.outs, cfg.percentiles, {str(k): v for k, v in cfg.goodput.items()})
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
            errors=([f"the profiled window stopped: {sent.stopped}"] if sent.stopped is not None else [])
            + profiler.cut_short(traces),
        )
