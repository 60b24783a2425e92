"""Arrival times, the concurrency cap and stopping a batch, against the fake server."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest
from helpers.bench_fake_server import FakeServer

from harness.bench.client import RequestOutput, Target, build_payload
from harness.bench.loadgen import LoadRun, Progress, arrival_offsets

pytestmark = pytest.mark.timeout(60)


def test_arrival_offsets():
    assert arrival_offsets(5, math.inf, np.random.default_rng(0)).tolist() == [0.0] * 5
    t = arrival_offsets(1000, 50.0, np.random.default_rng(0))
    assert t[-1] == pytest.approx(1000 / 50.0) and np.all(np.diff(t) >= 0)  # rescaled to end at n/rate
    gaps = np.diff(t)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.1)  # Poisson: CV 1
    bursty = np.diff(arrival_offsets(2000, 50.0, np.random.default_rng(0), burstiness=0.25))
    assert np.std(bursty) / np.mean(bursty) == pytest.approx(2.0, abs=0.25)  # gamma: CV 1/sqrt(k)
    even = arrival_offsets(4, 2.0, np.random.default_rng(0), burstiness=math.inf)
    assert even.tolist() == [0.5, 1.0, 1.5, 2.0]
    a, b = (arrival_offsets(10, 5.0, np.random.default_rng(7), 0.5) for _ in range(2))
    assert a.tolist() == b.tolist()  # seeded


def _batch(url: str, n: int, max_tokens: int = 3) -> tuple[list[bytes], list[RequestOutput]]:
    target = Target.from_url(url + "/v1/completions")
    wire = [target.request_bytes(build_payload("completions", "m", f"p{i}", max_tokens, True)) for i in range(n)]
    return wire, [RequestOutput(1, max_tokens) for _ in range(n)]


def test_concurrency_cap():
    with FakeServer(token_delay=0.01) as srv:
        wire, outs = _batch(srv.base_url, 12)
        progress = Progress()
        run = LoadRun(srv.base_url + "/v1/completions", False, wire, outs, [0.0] * 12, 3, 10, progress)
        assert asyncio.run(run.run(30)) is None
    assert all(o.success for o in outs) and (progress.done, progress.failed, progress.total) == (12, 0, 12)
    spans = sorted((o.start_time, 1) for o in outs) + sorted((o.end_time, -1) for o in outs)
    peak = max(np.cumsum([d for _, d in sorted(spans)]))
    assert peak == 3  # never more than C in flight
    assert sum(o.queue_time > 0.02 for o in outs) >= 8  # most waited for a slot


def test_requests_arrive_on_their_schedule():
    # Offsets 0.25 s apart, each request checked where it arrived: at the server, on the same
    # clock. Never early; late by the machine's load only: the median within 40 ms (a few ms is
    # usual on 2 busy cores), none past 0.5 s. Sending all at once, at the end, at the offsets'
    # running sum, or every request 100 ms late each break a bound.
    offsets = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    with FakeServer(token_delay=0.0) as srv:
        wire, outs = _batch(srv.base_url, len(offsets))
        run = LoadRun(srv.base_url + "/v1/completions", False, wire, outs, offsets, len(offsets), 10)
        t0 = time.perf_counter()
        assert asyncio.run(run.run(30, t0=t0)) is None
        arrived = {b["prompt"]: t - t0 for b, t in zip(srv.bodies, srv.arrived, strict=True)}
    assert all(o.success for o in outs)
    late = [arrived[f"p{i}"] - off for i, off in enumerate(offsets)]
    assert all(0 <= x < 0.5 for x in late) and float(np.median(late)) < 0.04, late
    # The lateness the client reports is the lateness the server saw, less the request's own
    # time on the wire: a client that sends late and hides it (queue time from a shifted
    # schedule) breaks this.
    hidden = [x - o.queue_time for x, o in zip(late, outs, strict=True)]
    assert all(-0.001 <= h < 0.5 for h in hidden) and float(np.median(hidden)) < 0.02, hidden


def test_stop_fails_in_flight_and_unsent_with_the_reason():
    with FakeServer(policy=lambda n, b: "hang" if b["prompt"] != "p0" else None) as srv:
        wire, outs = _batch(srv.base_url, 5)
        run = LoadRun(srv.base_url + "/v1/completions", False, wire, outs, [0.0] * 5, 2, 60)

        async def main() -> str | None:
            async def stop_once_two_hang() -> None:
                # Request 0 answered, 1 and 2 hang at the server, 3 and 4 wait for a slot.
                deadline = time.monotonic() + 10
                while len(srv.bodies) < 3:
                    assert time.monotonic() < deadline, "requests 1 and 2 never reached the server"
                    await asyncio.sleep(0.01)
                run.stop("target died: test")

            stopper = asyncio.create_task(stop_once_two_hang())
            reason = await run.run(60)
            await stopper
            return reason

        t0 = time.monotonic()
        assert asyncio.run(main()) == "target died: test"
        assert time.monotonic() - t0 < 5
    assert outs[0].success
    assert [o.error for o in outs[1:]] == ["target died: test"] * 4
    assert [o.start_time is not None for o in outs] == [True, True, True, False, False]  # in flight vs never sent
