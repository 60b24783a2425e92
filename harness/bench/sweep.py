"""Run a concurrency sweep: for each point, warmups then the measured requests."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import aiohttp
import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from harness.bench.client import RequestOutput, build_payload, stream_request
from harness.bench.config import BenchConfig
from harness.bench.dataset import SampleRequest, sample_requests
from harness.bench.metrics import compute_metrics
from harness.bench.results import BenchResult, ResultExistsError, result_filename, write_result

# Sub-streams of the seed per point, so a point's prompts do not depend on which
# other points are in the sweep, and points never repeat each other's prompts
# (a repeat would hit the server's prefix cache and flatter TTFT).
_MAIN, _WARMUP, _ARRIVALS = 0, 1, 2


@dataclass
class PointOutcome:
    concurrency: int
    path: Path | None  # None when the point could not be run or written
    completed: int = 0
    failed: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.path is not None and self.failed == 0 and self.error is None


def _log(msg: str) -> None:
    print(f"[pdbench bench] {msg}", file=sys.stderr, flush=True)


def arrival_offsets(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (s from start): all at once for inf, else Poisson arrivals.

    As vLLM (burstiness 1), the cumulative gaps are rescaled to end at n/rate so
    the achieved rate does not drift with the seed.
    """
    if math.isinf(rate) or n == 0:
        return np.zeros(n)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return t * (n / rate) / t[-1]


async def run_batch(
    session: aiohttp.ClientSession,
    cfg: BenchConfig,
    requests: list[SampleRequest],
    concurrency: int,
    rate: float,
    rng: np.random.Generator,
    timeout_s: float,
) -> list[RequestOutput]:
    """Send `requests` with at most `concurrency` in flight, all bounded by `timeout_s`.

    asyncio.wait (rather than wait_for around a gather) keeps what finished when
    the bound hits; the rest are cancelled and counted as failed.
    """
    sem = asyncio.Semaphore(concurrency)
    outs = [RequestOutput(r.prompt_len, r.output_len) for r in requests]
    offsets = arrival_offsets(len(requests), rate, rng)
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        delay = t0 + offsets[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with sem:  # arrival first, then wait for a slot, as vLLM does
            payload = build_payload(
                cfg.endpoint, cfg.model, requests[i].prompt, requests[i].output_len, cfg.ignore_eos
            )
            await stream_request(session, cfg.url, payload, cfg.request_timeout_s, outs[i])

    tasks = [asyncio.create_task(one(i)) for i in range(len(requests))]
    if not tasks:
        return outs
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for o in outs:
        if not o.success and not o.error:
            o.error = f"point timeout: unfinished after {timeout_s:g}s"
    return outs


async def run_point(
    session: aiohttp.ClientSession,
    cfg: BenchConfig,
    tokenizer: PreTrainedTokenizerBase,
    concurrency: int,
) -> BenchResult:
    n, n_warm = cfg.num_prompts_for(concurrency), cfg.num_warmups_for(concurrency)

    def sample(count: int, stream: int) -> list[SampleRequest]:
        rng = np.random.default_rng([cfg.seed, concurrency, stream])
        return sample_requests(
            tokenizer, count, cfg.isl, cfg.osl, cfg.range_ratio, cfg.range_ratio_convention, rng
        )

    measured = sample(n, _MAIN)
    if n_warm:
        # Warmups go out all at once (limited by C) and are left out of the metrics.
        warm = await run_batch(
            session, cfg, sample(n_warm, _WARMUP), concurrency, math.inf,
            np.random.default_rng([cfg.seed, concurrency, _ARRIVALS]),  # unused at rate inf
            cfg.point_timeout_for(n_warm, concurrency),
        )
        if bad := [o for o in warm if not o.success]:
            _log(f"C={concurrency}: {len(bad)}/{n_warm} warmup requests failed: {bad[0].error}")

    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    outs = await run_batch(
        session, cfg, measured, concurrency, cfg.request_rate,
        np.random.default_rng([cfg.seed, concurrency, _ARRIVALS]),
        cfg.point_timeout_for(n, concurrency),
    )
    return BenchResult(
        date=date,
        model_id=cfg.model,
        tokenizer_id=cfg.tokenizer,
        num_prompts=n,
        request_rate="inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
        max_concurrency=concurrency,
        range_ratio=cfg.range_ratio,
        range_ratio_convention=cfg.range_ratio_convention,
        random_input_len=cfg.isl,
        random_output_len=cfg.osl,
        metadata=cfg.metadata,
        **compute_metrics(outs, cfg.percentiles),
    )


async def _sweep(cfg: BenchConfig) -> list[PointOutcome]:
    result_dir = Path(cfg.result_dir)
    paths = {
        c: result_dir / result_filename(c, cfg.request_rate, cfg.prefill_gpus, cfg.decode_gpus)
        for c in cfg.concurrency
    }
    # Fail before sending any load rather than after a long point.
    if existing := [str(p) for p in paths.values() if p.exists()]:
        raise ResultExistsError(f"result files already exist, not overwriting: {', '.join(existing)}")
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)

    outcomes: list[PointOutcome] = []
    # One session for the sweep; the pool is sized for the largest point (aiohttp's
    # default of 100 would silently cap concurrency). Idle connections are dropped
    # before uvicorn's 5 s keep-alive would, so a cooldown never leaves a
    # half-closed connection for the next point's first request.
    connector = aiohttp.TCPConnector(limit=max(cfg.concurrency), keepalive_timeout=4)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=2**20) as session:
        for i, c in enumerate(cfg.concurrency):
            if i and cfg.cooldown_s:
                await asyncio.sleep(cfg.cooldown_s)
            try:
                result = await run_point(session, cfg, tokenizer, c)
                path = write_result(result, paths[c])
            except Exception as e:  # noqa: BLE001 - one bad point must not lose the others
                _log(f"C={c}: point could not be run: {type(e).__name__}: {e}")
                outcomes.append(PointOutcome(c, None, error=f"{type(e).__name__}: {e}"))
                continue
            outcomes.append(PointOutcome(c, path, result.completed, result.failed))
            _log(
                f"C={c}: completed {result.completed}, failed {result.failed}, "
                f"median TTFT {result.median_ttft_ms:.1f} ms, "
                f"output {result.output_throughput:.1f} tok/s -> {path.name}"
            )
    return outcomes


def run_sweep_detailed(config: BenchConfig) -> list[PointOutcome]:
    """Run every point; per-point outcomes tell the caller what failed."""
    return asyncio.run(_sweep(config))


def run_sweep(config: BenchConfig) -> list[Path]:
    """Run every point and return the result files written, in concurrency order."""
    return [o.path for o in run_sweep_detailed(config) if o.path is not None]
