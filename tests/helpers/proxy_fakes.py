"""Fake prefill/decode servers for the PD proxy tests, the proxy started in-process, and the
clients that read its answers. Each test runs one coroutine under a hard deadline (`run`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import zmq
import zmq.asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from benchmarks.common import free_port
from harness.proxy import ProxyConfig, serving
from harness.proxy.http import HttpConnection, HttpServer, Reply, Request, Stream

DEADLINE_S = 20.0

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
    """A fake vLLM server: records requests; answers as a prefill or a decode.

    Not the mock engine, on purpose: the proxy tests steer each upstream from the test
    (stall before headers or after the first chunk, answer only after another fake got its
    request, flip health) and inspect the headers and bodies the proxy forwarded; the
    mock engine (used by the proxy's connector and benchmark tests) cannot be steered so.
    """

    role: str
    healthy: bool = True
    stall_after_first: bool = False  # decode: send one chunk, then go silent
    stall_before_headers: bool = False  # hold the request without answering
    status: int = 200  # non-200: answer with a vLLM-style error body
    kv: dict[str, Any] | None = field(default_factory=lambda: dict(KV))  # prefill's answer
    wait_for: Fake | None = None  # hold the answer until that fake got a request
    received: list[tuple[CIMultiDict[str], dict[str, Any]]] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    server: TestServer | None = None

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
        self.started.set()
        try:
            if self.wait_for is not None:
                await asyncio.wait_for(self.wait_for.started.wait(), 5)
            if self.stall_before_headers:
                await asyncio.sleep(DEADLINE_S * 2)
            if self.status != 200:
                err = {"object": "error", "message": "prompt too long", "type": "BadRequestError", "code": self.status}
                return web.json_response(err, status=self.status)
            if self.role == "prefill":
                out: dict[str, Any] = {"id": "p", "choices": [{"index": 0, "text": "x"}]}
                if self.kv is not None:
                    out["kv_transfer_params"] = self.kv
                return web.json_response(out)
            if not body.get("stream"):
                return web.json_response({"id": "d", "choices": [{"index": 0, "text": "full"}]})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i, chunk in enumerate(CHUNKS):
                await resp.write(chunk)
                if self.stall_after_first:
                    await asyncio.sleep(DEADLINE_S * 2)  # cancelled when the proxy hangs up
                await asyncio.sleep(0.01 * i)
            await resp.write(DONE)
            return resp
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def start_fake(fake: Fake) -> TestServer:
    server = TestServer(fake.app(), host="127.0.0.1", handler_cancellation=True)
    await server.start_server()
    fake.server = server
    fake.url = str(server.make_url("")).rstrip("/")
    return server


@asynccontextmanager
async def proxy_client(config: ProxyConfig) -> AsyncIterator[aiohttp.ClientSession]:
    """The proxy as `pdbench proxy` runs it (its own HTTP server) on a free port, and a client of it."""
    config = config.model_copy(update={"host": "127.0.0.1", "port": 0})
    async with serving(config) as proxy, aiohttp.ClientSession(base_url=f"http://127.0.0.1:{proxy.port}") as client:
        yield client


@asynccontextmanager
async def stack(
    prefills: list[Fake],
    decodes: list[Fake],
    extra_prefill_urls: tuple[str, ...] = (),
    wait_ready: bool = True,
    **cfg: Any,
) -> AsyncIterator[aiohttp.ClientSession]:
    """Start the fakes and a proxy in front of them; yield a client of the proxy."""
    servers = []
    try:
        for fake in [*prefills, *decodes]:
            servers.append(await start_fake(fake))
        config = ProxyConfig(
            prefill=[*extra_prefill_urls, *(f.url for f in prefills)],
            decode=[f.url for f in decodes],
            **{"health_interval_s": 0.05, "health_failures": 1, **cfg},
        )
        async with proxy_client(config) as client:
            if wait_ready:
                await wait_health(client, 200)
            yield client
    finally:
        for server in servers:
            await server.close()


async def wait_health(
    client: aiohttp.ClientSession, status: int, pred: Callable[[dict], bool] = lambda b: True
) -> dict:
    body: dict[str, Any] = {}
    for _ in range(250):  # bounded: 250 x 20 ms
        resp = await client.get("/health")
        body = await resp.json()
        if resp.status == status and pred(body):
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"/health never returned {status}; last {body}")


def counts(body: dict[str, Any]) -> dict[str, Any]:
    keys = ("status", "prefill_instances", "decode_instances", "expected_prefill", "expected_decode")
    return {k: body[k] for k in keys}


async def metrics_text(client: aiohttp.ClientSession) -> str:
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    return await resp.text()


COMPLETION = {
    "model": "tiny",
    "prompt": "hello",
    "max_tokens": 7,
    "min_tokens": 3,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": True,
}

NIXL_PREFILL_KV = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


async def read_all(resp: aiohttp.ClientResponse) -> bytes:
    return b"".join([chunk async for chunk in resp.content.iter_any()])


@asynccontextmanager
async def moriio_stack(
    fakes: list[Fake], **cfg: Any
) -> AsyncIterator[tuple[aiohttp.ClientSession, zmq.asyncio.Context, str]]:
    servers = [await start_fake(f) for f in fakes]
    port = free_port()
    config = ProxyConfig(
        connector="moriio",
        moriio_host="127.0.0.1",
        moriio_port=port,
        **{"health_interval_s": 0.05, "health_failures": 1, **cfg},
    )
    ctx = zmq.asyncio.Context()
    try:
        async with proxy_client(config) as client:
            yield client, ctx, f"tcp://127.0.0.1:{port}"
    finally:
        ctx.destroy(linger=0)
        for s in servers:
            await s.close()


PIECE = b"x" * (1 << 20)

PIECES = 64


@asynccontextmanager
async def http_server(keepalive_s: float = 75.0) -> AsyncIterator[tuple[int, dict[str, int]]]:
    """An HttpServer with test routes; yields its port and the streaming route's progress."""
    progress = {"written": 0}

    async def echo(request: Request, conn: HttpConnection) -> Reply:
        return Reply(json.dumps({"path": request.path, "body": request.body.decode()}).encode())

    async def big(request: Request, conn: HttpConnection) -> Stream:
        stream = conn.stream(request, 200, "application/octet-stream")
        for _ in range(PIECES):
            await stream.write(PIECE)
            progress["written"] += 1
        stream.end()
        return stream

    async def broken(request: Request, conn: HttpConnection) -> Reply:
        raise RuntimeError("handler bug")

    routes = {("POST", "/echo"): echo, ("GET", "/big"): big, ("GET", "/broken"): broken}
    server = HttpServer(routes, max_body=1024, keepalive_s=keepalive_s)  # type: ignore[dict-item]
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server.protocol, "127.0.0.1", 0)
    sweeper = asyncio.ensure_future(server.sweep())
    try:
        yield listener.sockets[0].getsockname()[1], progress
    finally:
        sweeper.cancel()
        listener.close()
        server.close_all()


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """(status line, headers, body) of one Content-Length or chunked response."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    if "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    else:
        assert headers.get("transfer-encoding") == "chunked"
        parts = []
        while True:
            size = int(await asyncio.wait_for(reader.readline(), 5), 16)
            parts.append(await asyncio.wait_for(reader.readexactly(size + 2), 5))
            if size == 0:
                break
        body = b"".join(p[:-2] for p in parts)
    return status.encode(), headers, body


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body
