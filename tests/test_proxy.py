"""Tests of the PD proxy against fake prefill/decode servers (no vLLM).

Each test is a sync function running one coroutine under a hard deadline, so
nothing can hang; the fakes are aiohttp servers on 127.0.0.1 ephemeral ports.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import aiohttp
import pytest
import typer
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict
from typer.testing import CliRunner

from harness.proxy import ProxyConfig, build_app
from harness.proxy import cli as proxy_cli

DEADLINE_S = 15.0
KV = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "engine-abc",
    "remote_block_ids": [3, 4, 5],
    "remote_host": "10.0.0.1",
    "remote_port": 5600,
}
CHUNKS = [f'data: {{"choices":[{{"index":0,"text":"tok{i}"}}]}}\n\n'.encode() for i in range(3)]
DONE = b"data: [DONE]\n\n"


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro_fn(), DEADLINE_S))


@dataclass
class Fake:
    """A fake vLLM server: records requests; answers as a prefill or a decode."""

    role: str
    healthy: bool = True
    stall_after_first: bool = False  # decode: send one chunk, then go silent
    status: int = 200  # non-200: answer with a vLLM-style error body
    received: list[tuple[CIMultiDict[str], dict[str, Any]]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": f"tiny-{self.role}"}]})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append((request.headers.copy(), body))
        if self.status != 200:
            err = {"object": "error", "message": "prompt too long", "type": "BadRequestError", "code": self.status}
            return web.json_response(err, status=self.status)
        if self.role == "prefill":
            return web.json_response({"id": "p", "choices": [{"index": 0, "text": "x"}], "kv_transfer_params": KV})
        if not body.get("stream"):
            return web.json_response({"id": "d", "choices": [{"index": 0, "text": "full"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i, chunk in enumerate(CHUNKS):
                await resp.write(chunk)
                if self.stall_after_first:
                    await asyncio.sleep(DEADLINE_S * 2)  # cancelled when the proxy hangs up
                await asyncio.sleep(0.01 * i)
            await resp.write(DONE)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return resp


@asynccontextmanager
async def stack(
    prefills: list[Fake], decodes: list[Fake], extra_prefill_urls: tuple[str, ...] = (), **cfg: Any
) -> AsyncIterator[TestClient]:
    """Start the fakes and a proxy in front of them; yield a client of the proxy."""
    servers = []
    try:
        for fake in [*prefills, *decodes]:
            server = TestServer(fake.app(), host="127.0.0.1")
            await server.start_server()
            servers.append(server)
            fake.url = str(server.make_url("")).rstrip("/")
        config = ProxyConfig(
            prefill=[*extra_prefill_urls, *(f.url for f in prefills)],
            decode=[f.url for f in decodes],
            **{"health_interval_s": 0.05, **cfg},
        )
        client = TestClient(TestServer(build_app(config), host="127.0.0.1"))
        await client.start_server()
        try:
            yield client
        finally:
            await client.close()
    finally:
        for server in servers:
            await server.close()


def dead_url() -> str:
    """A URL on which nothing listens (port freed right away)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def wait_health(client: TestClient, status: int) -> dict[str, Any]:
    for _ in range(200):  # bounded: 200 x 20 ms
        resp = await client.get("/health")
        body = await resp.json()
        if resp.status == status:
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"/health never returned {status}; last {body}")


COMPLETION = {
    "model": "tiny",
    "prompt": "hello",
    "max_tokens": 7,
    "min_tokens": 3,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": True,
}


def test_two_phase_flow_bodies_headers_and_stream_order() -> None:
    async def body() -> None:
        p, d = Fake("prefill"), Fake("decode")
        async with stack([p], [d]) as client:
            resp = await client.post("/v1/completions", json=COMPLETION, headers={"Authorization": "Bearer k"})
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            got = []
            async for chunk in resp.content.iter_any():
                got.append(chunk)
            assert b"".join(got) == b"".join(CHUNKS) + DONE

        (p_headers, p_body), = p.received
        (d_headers, d_body), = d.received
        assert p_body == {
            "model": "tiny",
            "prompt": "hello",
            "max_tokens": 1,
            "stream": False,
            "ignore_eos": True,
            "kv_transfer_params": {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            },
        }
        assert d_body == {**COMPLETION, "kv_transfer_params": KV}
        assert p_headers["X-Request-Id"] == d_headers["X-Request-Id"]
        assert len(p_headers["X-Request-Id"]) >= 32
        assert p_headers["Authorization"] == d_headers["Authorization"] == "Bearer k"
        assert resp.headers["X-Request-Id"] == p_headers["X-Request-Id"]

    run(body)


def test_chat_without_max_tokens_and_non_streaming() -> None:
    async def body() -> None:
        p, d = Fake("prefill"), Fake("decode")
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
        plain = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        async with stack([p], [d]) as client:
            for req in (chat, plain):
                resp = await client.post("/v1/chat/completions", json=req)
                assert resp.status == 200
                assert resp.content_type == "application/json"
                assert (await resp.json())["choices"][0]["text"] == "full"
        assert p.received[0][1]["max_tokens"] == 1
        assert p.received[0][1]["max_completion_tokens"] == 1
        assert p.received[1][1]["max_tokens"] == 1
        assert "max_completion_tokens" not in p.received[1][1]
        assert d.received[0][1] == {**chat, "kv_transfer_params": KV}
        assert d.received[1][1] == {**plain, "kv_transfer_params": KV}  # no max_tokens added
        assert p.received[0][0]["X-Request-Id"] != p.received[1][0]["X-Request-Id"]

    run(body)


def test_round_robin_over_two_decodes_and_two_prefills() -> None:
    async def body() -> None:
        prefills, decodes = [Fake("prefill"), Fake("prefill")], [Fake("decode"), Fake("decode")]
        async with stack(prefills, decodes) as client:
            for _ in range(4):
                resp = await client.post("/v1/completions", json={**COMPLETION, "stream": False})
                assert resp.status == 200
                await resp.read()
        assert [len(f.received) for f in prefills + decodes] == [2, 2, 2, 2]

    run(body)


def test_health_503_until_all_backends_up() -> None:
    async def body() -> None:
        p, d1, d2 = Fake("prefill", healthy=False), Fake("decode", healthy=False), Fake("decode", healthy=False)
        async with stack([p], [d1, d2]) as client:
            resp = await client.get("/health")
            assert resp.status == 503
            assert await resp.json() == {
                "status": "not_ready", "prefill_instances": 0, "decode_instances": 0,
                "expected_prefill": 1, "expected_decode": 2,
            }
            p.healthy = d1.healthy = True
            for _ in range(200):  # wait until the poller saw both come up
                state = await (await client.get("/health")).json()
                if state["prefill_instances"] == 1 and state["decode_instances"] == 1:
                    break
                await asyncio.sleep(0.02)
            resp = await client.get("/health")
            assert resp.status == 503
            assert (await resp.json())["status"] == "not_ready"
            d2.healthy = True
            assert await wait_health(client, 200) == {
                "status": "ok", "prefill_instances": 1, "decode_instances": 2,
                "expected_prefill": 1, "expected_decode": 2,
            }
            d1.healthy = False  # going down again is noticed too
            assert (await wait_health(client, 503))["decode_instances"] == 1

    run(body)


def test_models_forwarded_to_decode() -> None:
    async def body() -> None:
        async with stack([Fake("prefill")], [Fake("decode")]) as client:
            resp = await client.get("/v1/models")
            assert resp.status == 200
            assert (await resp.json())["data"][0]["id"] == "tiny-decode"

    run(body)


def test_dead_prefill_gives_502_naming_backend() -> None:
    async def body() -> None:
        url = dead_url()
        p, d = Fake("prefill"), Fake("decode")
        async with stack([p], [d], extra_prefill_urls=(url,)) as client:
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 502
            err = (await resp.json())["error"]
            assert err["backend"] == url
            assert err["type"] == "connection_error"
            assert url.split("//")[1] in err["message"] or "connect" in err["message"].lower()
            # The next request round-robins to the live prefill.
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 200
            await resp.read()
        assert len(d.received) == 1  # only the request that reached a live prefill

    run(body)


def test_prefill_4xx_passed_through_with_backend() -> None:
    async def body() -> None:
        p, d = Fake("prefill", status=400), Fake("decode")
        async with stack([p], [d]) as client:
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 400
            err = (await resp.json())["error"]
            assert err["backend"] == p.url
            assert "prompt too long" in err["message"]
        assert d.received == []

    run(body)


def test_prefill_5xx_gives_502() -> None:
    async def body() -> None:
        p = Fake("prefill", status=500)
        async with stack([p], [Fake("decode")]) as client:
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 502
            assert (await resp.json())["error"]["backend"] == p.url

    run(body)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe", b""])
def test_malformed_body_gives_400(raw: bytes) -> None:
    async def body() -> None:
        p = Fake("prefill")
        async with stack([p], [Fake("decode")]) as client:
            resp = await client.post("/v1/completions", data=raw, headers={"Content-Type": "application/json"})
            assert resp.status == 400
            assert "error" in await resp.json()
        assert p.received == []

    run(body)


def test_stalled_decode_is_aborted_after_idle_timeout() -> None:
    async def body() -> None:
        d = Fake("decode", stall_after_first=True)
        async with stack([Fake("prefill")], [d], stream_idle_timeout_s=0.3) as client:
            start = time.monotonic()
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert resp.status == 200
            got = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in resp.content.iter_any():
                    got += chunk
            assert time.monotonic() - start < 5
            assert got.startswith(CHUNKS[0])
            assert b"stream_idle_timeout" in got and DONE not in got
            await asyncio.wait_for(d.cancelled.wait(), 5)  # upstream request was dropped

    run(body)


def test_client_disconnect_cancels_decode() -> None:
    async def body() -> None:
        d = Fake("decode", stall_after_first=True)
        async with stack([Fake("prefill")], [d]) as client:
            resp = await client.post("/v1/completions", json=COMPLETION)
            assert await resp.content.readany() == CHUNKS[0]
            resp.close()  # drop the connection mid-stream
            await asyncio.wait_for(d.cancelled.wait(), 5)

    run(body)


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command("proxy")(proxy_cli.proxy_command)
    app.command("other")(lambda: None)  # keep "proxy" a subcommand, as in harness.cli
    return app


def test_cli_builds_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ProxyConfig] = []
    monkeypatch.setattr(proxy_cli, "serve", seen.append)
    args = ["proxy", "--port", "31000", "--prefill", "http://10.0.0.1:8100/", "--prefill", "10.0.0.2:8100",
            "--decode", "http://10.0.0.3:8200", "--stream-idle-timeout-s", "5"]
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 0, result.output
    (cfg,) = seen
    assert cfg.port == 31000 and cfg.host == "0.0.0.0"
    assert cfg.prefill == ["http://10.0.0.1:8100", "http://10.0.0.2:8100"]
    assert cfg.decode == ["http://10.0.0.3:8200"]
    assert (cfg.request_timeout_s, cfg.stream_idle_timeout_s, cfg.health_interval_s) == (600, 5, 2)


@pytest.mark.parametrize(
    "args",
    [
        ["--prefill", "http://a:1", "--decode", "http://b:2", "--connector", "lmcache"],
        ["--decode", "http://b:2"],
        ["--prefill", "http://a:1", "--decode", "http://b:2", "--request-timeout-s", "0"],
    ],
)
def test_cli_rejects_bad_options(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setattr(proxy_cli, "serve", lambda cfg: pytest.fail("must not serve"))
    result = CliRunner().invoke(_cli(), ["proxy", *args])
    assert result.exit_code == 2
    assert "Error" in result.output
