"""Session affinity in the PD proxy (policy `session`), against pdbench's mock engines: every turn
of a session lands on the same decode instance (the header's, else the prompt prefix's), sessions
spread over the instances, and the proxy's /metrics reports each instance's routed legs and peak
legs in flight. Which decode served a leg is read from each mock engine's own /metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from helpers.proxy_fakes import metrics_text, proxy_client, run, wait_health

import harness.mock_engine as mock
from harness.proxy import ProxyConfig
from harness.rundir.session_header import SESSION_HEADER
from harness.validity.series import Scrape


@asynccontextmanager
async def one_p_two_d(**cfg: Any) -> AsyncIterator[tuple[aiohttp.ClientSession, list[str]]]:
    """1 prefill and 2 decode mock engines behind a proxy; yields a client and the decodes' URLs."""
    servers: list[TestServer] = []
    try:
        for role in ("prefill", "decode", "decode"):
            mock_cfg = mock.MockEngineConfig(role=role, model="m", ttft_ms=cfg.pop(f"{role}_ttft_ms", "0"))
            server = TestServer(mock.build_app(mock_cfg), host="127.0.0.1")
            await server.start_server()
            servers.append(server)
        urls = [str(s.make_url("")).rstrip("/") for s in servers]
        config = ProxyConfig(prefill=urls[:1], decode=urls[1:], health_interval_s=0.05, **cfg)
        async with proxy_client(config) as client:
            await wait_health(client, 200)
            yield client, urls[1:]
    finally:
        for s in servers:
            await s.close()


async def served(urls: list[str]) -> list[float]:
    """Requests each engine finished, from its own /metrics."""
    out = []
    async with aiohttp.ClientSession() as http:
        for url in urls:
            text = await (await http.get(f"{url}/metrics")).text()
            total = Scrape.parse(text).total(r"vllm:request_success_total")
            out.append(total[0] if total else 0.0)
    return out


async def turn(client: aiohttp.ClientSession, prompt: str, session: str | None) -> None:
    headers = {SESSION_HEADER: session} if session is not None else {}
    body = {"model": "m", "prompt": prompt, "max_tokens": 2, "stream": False}
    resp = await client.post("/v1/completions", json=body, headers=headers)
    assert resp.status == 200, await resp.text()


async def session_spread(client: aiohttp.ClientSession, decodes: list[str], sid: str | None, first: str) -> list[float]:
    """Three turns of one session, each prompt the previous one plus new text; the decodes' share."""
    before = await served(decodes)
    prompt = first
    for k in range(3):
        prompt += f" answer {k} then the user says more {k}"
        await turn(client, prompt, sid)
    return [a - b for a, b in zip(await served(decodes), before, strict=True)]


def test_session_header_keeps_each_session_on_one_decode_and_spreads_sessions() -> None:
    async def body() -> None:
        async with one_p_two_d(policy="session") as (client, decodes):
            spreads = [await session_spread(client, decodes, f"s{i}", f"hello {i}") for i in range(24)]
        assert all(sorted(s) == [0, 3] for s in spreads), spreads  # each session whole on one decode
        per_decode = [sum(s[i] for s in spreads) for i in range(2)]
        assert min(per_decode) > 0, per_decode  # and the sessions use both decodes

    run(body)


def test_round_robin_splits_a_session_over_the_decodes() -> None:
    # The control: without affinity the same turns go to both instances.
    async def body() -> None:
        async with one_p_two_d(policy="round_robin") as (client, decodes):
            spread = await session_spread(client, decodes, "s0", "hello")
        assert sorted(spread) == [1, 2]

    run(body)


def test_without_a_header_the_session_policy_follows_the_prompt_prefix() -> None:
    # A first turn longer than prefix_chars: later turns start with it, so they stay together.
    async def body() -> None:
        async with one_p_two_d(policy="session", prefix_chars=32) as (client, decodes):
            spreads = [
                await session_spread(client, decodes, None, f"system prompt number {i} of this long session")
                for i in range(8)
            ]
        assert all(sorted(s) == [0, 3] for s in spreads), spreads

    run(body)


def test_proxy_metrics_report_routed_legs_and_peak_in_flight_per_instance() -> None:
    async def body() -> None:
        async with one_p_two_d(policy="session", decode_ttft_ms="300") as (client, decodes):
            # Four turns of one session at once: all on its decode, which then has four in flight.
            await asyncio.gather(*(turn(client, f"question {i}", "busy") for i in range(4)))
            scrape = Scrape.parse(await metrics_text(client))

        def per_decode(name: str) -> dict[str, float]:
            found = {d: scrape.total(name, backend=d) for d in decodes}
            assert all(v is not None for v in found.values()), f"{name} missing: {found}"
            return {d: v[0] for d, v in found.items() if v is not None}

        routed = per_decode("pdbench_proxy_backend_routed_total")
        peak = per_decode("pdbench_proxy_backend_outstanding_peak")
        assert sorted(routed.values()) == [0, 4], routed
        busy = next(d for d, v in routed.items() if v == 4)
        assert {d: peak[d] for d in decodes} == {d: 4 if d == busy else 0 for d in decodes}, peak

    run(body)


def test_an_instance_leaving_moves_only_its_own_sessions() -> None:
    # Rendezvous hashing: the sessions of the instances that stay keep their instance.
    from harness.proxy.backends import Backend, Pool, hash64

    config = ProxyConfig(prefill=["http://p:1"], decode=[f"http://d{i}:1" for i in range(3)], policy="session")
    pool = Pool(config)
    for url in config.decode:
        pool.add(Backend("decode", url, healthy=True))
    keys = [hash64(f"s{i}".encode()) for i in range(200)]

    def placement() -> list[str]:
        return [picked[0].url for k in keys if (picked := pool.pick("decode", k, 0.0)) is not None]

    before = placement()
    assert len(set(before)) == 3  # precondition: every instance has sessions
    gone = pool.backends["decode"][1]
    gone.healthy = False
    after = placement()
    assert gone.url not in after
    assert all(a == b for a, b in zip(after, before, strict=True) if b != gone.url)
