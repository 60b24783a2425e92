"""`pdbench proxy --workers N`: one view of legs in flight and open circuits across the
processes (harness.proxy.shared), in one process with two rows and with real processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import aiohttp
import pytest
from helpers.proxy_fakes import COMPLETION, DEADLINE_S, Fake, run, start_fake

from benchmarks.common import free_port
from harness.proxy import ProxyConfig
from harness.proxy.backends import Backend, Pool
from harness.proxy.shared import SharedState

DECODES = ("http://10.0.0.1:8000", "http://10.0.0.2:8000")


def worker_pools(workers: int = 2) -> list[Pool]:
    """The pools of `workers` processes, as each builds it, over one shared mapping."""
    cfg = ProxyConfig(prefill=["http://10.0.0.9:8000"], decode=list(DECODES), policy="least_outstanding")
    state = SharedState(workers, 3)
    pools = []
    for w in range(workers):
        pool = Pool(cfg)
        pool.add(Backend("prefill", cfg.prefill[0]))
        for url in DECODES:
            pool.add(Backend("decode", url))
        pool.share(state.as_worker(w))
        for b in pool.all():
            b.healthy = True
        pools.append(pool)
    return pools


def test_least_outstanding_sees_every_workers_legs() -> None:
    a, b = worker_pools()
    # Worker 0 sends three legs to the first decode; worker 1 must go to the other one.
    a.backends["decode"][0].outstanding += 3
    picked = b.pick("decode", None, time.monotonic())
    assert picked is not None and picked[0].url == DECODES[1]
    assert [d.load() for d in b.backends["decode"]] == [3, 0]
    assert [d.outstanding for d in b.backends["decode"]] == [0, 0]  # worker 1's own: none
    # Each row is its writer's alone: no update is lost when both change one backend.
    b.backends["decode"][0].outstanding += 2
    a.backends["decode"][0].outstanding -= 1
    assert a.backends["decode"][0].load() == b.backends["decode"][0].load() == 4


def test_a_circuit_opened_by_one_worker_is_open_in_all_and_readmitted_by_any() -> None:
    a, b = worker_pools()
    cfg = a.cfg
    d_a, d_b = a.backends["decode"][0], b.backends["decode"][0]
    for _ in range(cfg.breaker_failures):
        a.record_failure(d_a, "HTTP 500")
    assert d_b.out_since is not None and d_b.out_since == d_a.out_since
    assert [d.url for d in b.available("decode", time.monotonic())] == [DECODES[1]]
    d_b.out_since = time.monotonic() - cfg.breaker_min_open_s  # open long enough
    b.record_health(d_b, True, "")
    assert d_a.out_since is None and len(a.available("decode", time.monotonic())) == 2


def test_worker_rows_are_checked() -> None:
    state = SharedState(2, 3)
    with pytest.raises(ValueError, match=r"worker 2 outside 0\.\.1"):
        state.as_worker(2)
    with pytest.raises(ValueError, match=r"slot 3 outside 0\.\.2"):
        state.columns(3)


def test_two_proxy_processes_balance_and_report_the_legs_of_both() -> None:
    """Requests that stay in flight, sent one at a time over fresh connections (the kernel
    spreads them over both processes): least-outstanding over the sum puts exactly half on
    each decode, and every process's /health reports all of them."""
    n = 8

    async def go() -> None:
        p = Fake("prefill")
        decodes = [Fake("decode", stall_after_first=True), Fake("decode", stall_after_first=True)]
        servers = [await start_fake(f) for f in (p, *decodes)]
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness",
                "proxy",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "2",
                "--policy",
                "least_outstanding",
                "--prefill",
                p.url,
                *(a for d in decodes for a in ("--decode", d.url)),
                "--health-interval-s",
                "0.05",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        base = f"http://127.0.0.1:{port}"
        pending: list[asyncio.Task[bytes]] = []
        try:
            deadline = time.monotonic() + DEADLINE_S
            ready: set[int] = set()
            while len(ready) < 2:  # both processes up and ready: each answered 200 (fresh connections)
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, f"the proxy never became ready (ready: {ready})"
                try:
                    async with aiohttp.ClientSession() as s, s.get(base + "/health") as r:
                        if r.status == 200:
                            ready.add((await r.json())["pid"])
                            continue
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)

            async def one() -> bytes:
                async with aiohttp.ClientSession() as s, s.post(base + "/v1/completions", json=COMPLETION) as r:
                    return await r.read()

            for i in range(n):
                pending.append(asyncio.ensure_future(one()))
                while sum(len(d.received) for d in decodes) < i + 1:  # picked and sent
                    await asyncio.sleep(0.01)
            assert [len(d.received) for d in decodes] == [n // 2, n // 2]
            seen = []
            for _ in range(8):  # fresh connections: both processes answer some
                async with aiohttp.ClientSession() as s, s.get(base + "/health") as r:
                    body = await r.json()
                seen.append(sorted(b["outstanding"] for b in body["backends"] if b["role"] == "decode"))
            assert seen == [[n // 2, n // 2]] * 8
        finally:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            proc.terminate()
            proc.wait(10)
            for s in servers:
                await s.close()

    run(go)
