"""The proxy's lean upstream HTTP client against raw asyncio servers: keep-alive reuse,
a stale kept-alive connection, chunked bodies, timeouts, garbage, back-pressure."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from helpers.proxy_fakes import COMPLETION, Fake, proxy_client, run, start_fake, wait_health

from harness.proxy import ProxyConfig
from harness.proxy.upstream import HIGH_WATER, UpstreamClient, UpstreamFailure

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[int, list[int]]]:
    """A TCP server calling handler(reader, writer, connection number); yields (port, connections)."""
    conns: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(len(conns))
        try:
            await handler(reader, writer, len(conns) - 1)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], conns
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


def test_keep_alive_reuse_and_request_shape() -> None:
    async def body() -> None:
        seen: list[bytes] = []

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            while True:
                seen.append(await read_request(reader))
                writer.write(ok(b'{"ok":1}'))
                await writer.drain()

        async with raw_server(handler) as (port, conns):
            client = UpstreamClient(5)
            for _ in range(3):
                resp = await client.post(
                    "127.0.0.1",
                    port,
                    "/v1/completions",
                    b'{"a":1}',
                    {"Content-Type": "application/json", "X-Request-Id": "r"},
                    5,
                )
                assert (resp.status, resp.content_type, resp.content_length) == (200, "application/json", 8)
                assert await resp.read(1 << 20) == b'{"ok":1}'
            client.close()
        assert len(conns) == 1  # one connection carried all three
        assert seen[0].startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port)
        assert b"Content-Length: 7\r\n" in seen[0] and b"X-Request-Id: r\r\n" in seen[0]
        assert seen[0].endswith(b'\r\n\r\n{"a":1}')

    run(body)


def test_stale_kept_alive_connection_is_retried_on_a_fresh_one() -> None:
    async def body() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await read_request(reader)
            writer.write(ok(b"{}"))
            await writer.drain()
            await read_request(reader)  # a second request on a kept-alive connection:
            writer.transport.abort()  # the backend had timed it out (as uvicorn does after 5 s)

        async with raw_server(handler) as (port, conns):
            client = UpstreamClient(5)
            for _ in range(3):
                resp = await client.post("127.0.0.1", port, "/x", b"{}", {}, 5)
                assert await resp.read(100) == b"{}"
            client.close()
        assert len(conns) == 3

    run(body)


def test_chunked_body_read_in_pieces_then_eof() -> None:
    async def body() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (b"data: 1\n\n", b"data: 2\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
                await asyncio.sleep(0.05)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

        async with raw_server(handler) as (port, _):
            client = UpstreamClient(5)
            resp = await client.post("127.0.0.1", port, "/x", b"{}", {}, 5, idle=1)
            assert resp.content_type == "text/event-stream" and resp.content_length is None
            parts = []
            while chunk := await resp.read_chunk():
                parts.append(chunk)
            assert parts == [b"data: 1\n\n", b"data: 2\n\n"] and resp.at_eof
            client.close()

    run(body)


@pytest.mark.parametrize("mode", ["idle", "total", "garbage", "disconnect", "refused", "too_big"])
def test_failures_raise_upstream_failure(mode: str) -> None:
    async def body() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await read_request(reader)
            if mode == "garbage":
                writer.write(b"SPDY/9 what\r\n\r\n")
            elif mode == "disconnect":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
                await writer.drain()
                writer.transport.abort()
                return
            elif mode == "too_big":
                writer.write(ok(b"x" * 200))
            else:  # headers, one chunk, then silence
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
            await asyncio.sleep(30)

        async with raw_server(handler) as (port, _):
            client = UpstreamClient(5)
            target = port if mode != "refused" else _closed_port()
            kind = {"idle": "stream_idle_timeout", "total": "timeout"}.get(mode, "connection_error")
            with pytest.raises(UpstreamFailure) as info:
                resp = await client.post(
                    "127.0.0.1",
                    target,
                    "/x",
                    b"{}",
                    {},
                    0.4 if mode == "total" else 5,
                    idle=0.2 if mode == "idle" else None,
                )
                if mode == "too_big":
                    await resp.read(100)
                while await resp.read_chunk():
                    pass
            assert info.value.kind == kind
            client.close()

    run(body)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_slow_reader_pauses_upstream_and_idle_timer_waits() -> None:
    async def body() -> None:
        sent = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            blob = b"y" * 65536
            for _ in range(64):  # 4 MiB, far above the high-water mark
                writer.write(b"%x\r\n%s\r\n" % (len(blob), blob))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            sent.set()

        async with raw_server(handler) as (port, _):
            client = UpstreamClient(5)
            resp = await client.post("127.0.0.1", port, "/x", b"{}", {}, 10, idle=0.3)
            await asyncio.sleep(0.8)  # the proxy's client is slow: reading pauses, no idle timeout
            first = await resp.read_chunk()
            assert HIGH_WATER < len(first) < 4 * 1024 * 1024
            total = len(first)
            while chunk := await resp.read_chunk():
                total += len(chunk)
            assert total == 64 * 65536 and sent.is_set()
            client.close()

    run(body)


def test_proxy_survives_garbage_from_a_backend() -> None:
    async def body() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            line = await reader.readline()
            if line.startswith(b"GET /health"):
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            writer.write(b"\x00\xffnot http at all\r\n\r\n")
            await writer.drain()

        async with raw_server(handler) as (port, _):
            d = Fake("decode")
            server = await start_fake(d)
            cfg = ProxyConfig(prefill=[f"http://127.0.0.1:{port}"], decode=[d.url], health_interval_s=0.05)
            async with proxy_client(cfg) as client:
                await wait_health(client, 200)
                for _ in range(3):
                    resp = await client.post("/v1/completions", json=COMPLETION)
                    assert resp.status == 502
                    err = (await resp.json())["error"]
                    assert err["backend"] == f"http://127.0.0.1:{port}" and "bad HTTP response" in err["message"]
                resp = await client.get("/health")
                assert resp.status in (200, 503) and json.loads(await resp.read())["expected_prefill"] == 1
            await server.close()

    run(body)
