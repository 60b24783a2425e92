"""The proxy's own HTTP/1.1 server (harness.proxy.http), over raw sockets: keep-alive and
its idle limit, pipelining, framing for HTTP/1.0 and 1.1, Expect: 100-continue, bad
requests, backpressure towards a slow client, and a handler that fails."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from helpers.proxy_fakes import (
    CHUNKS,
    DONE,
    PIECE,
    PIECES,
    Fake,
    http_server,
    post,
    read_response,
    run,
    start_fake,
    wait_health,
)

from harness.proxy import ProxyConfig, serving


def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    async def go() -> None:
        async with http_server() as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post("/echo", b"one") + post("/echo?q=1", b"two") + post("/nowhere", b""))
            for expected in (b"one", b"two"):
                status, _, body = await read_response(reader)
                assert status == b"HTTP/1.1 200 OK"
                assert json.loads(body)["body"] == expected.decode()
            status, _, body = await read_response(reader)
            assert status == b"HTTP/1.1 404 Not Found"
            assert json.loads(body)["error"]["type"] == "not_found"
            writer.close()

    run(go)


def test_idle_connection_is_closed_after_the_keepalive_limit() -> None:
    async def go() -> None:
        async with http_server(keepalive_s=0.2) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post("/echo", b"a"))
            await read_response(reader)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
            assert 0.15 < loop.time() - t0 < 2.0
            # A request that never completes is bounded by the same limit.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
            assert await asyncio.wait_for(reader.read(), 5) == b""

    run(go)


def test_malformed_request_gets_400_and_the_connection_closes() -> None:
    async def go() -> None:
        async with http_server() as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            status, headers, body = await read_response(reader)
            assert status.startswith(b"HTTP/1.1 400")
            assert headers["connection"] == "close"
            assert "malformed HTTP request" in json.loads(body)["error"]["message"]
            assert await asyncio.wait_for(reader.read(), 5) == b""

    run(go)


def test_expect_100_continue_and_a_body_over_the_limit() -> None:
    async def go() -> None:
        async with http_server() as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"abc")
            status, headers, body = await read_response(reader)
            assert status == b"HTTP/1.1 200 OK" and json.loads(body)["body"] == "abc"
            assert "connection" not in headers  # kept alive
            # Over the limit (1024): no 100 Continue; the body is dropped and the connection ends.
            writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: 2000\r\nExpect: 100-continue\r\n\r\n")
            writer.write(b"y" * 2000)
            status, headers, body = await read_response(reader)
            assert json.loads(body)["body"] == "" and headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 5) == b""

    run(go)


def test_a_slow_client_holds_the_stream_back_instead_of_buffering_it() -> None:
    async def go() -> None:
        async with http_server() as (port, progress):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
            writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.sleep(1.0)  # not reading: kernel buffers fill, then the writer waits
            assert progress["written"] < PIECES // 2, progress
            status, headers, body = await read_response(reader)
            assert status == b"HTTP/1.1 200 OK" and headers["transfer-encoding"] == "chunked"
            assert len(body) == PIECES * len(PIECE) and progress["written"] == PIECES

    run(go)


def test_a_failing_handler_answers_500_and_closes() -> None:
    async def go() -> None:
        async with http_server() as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, _ = await read_response(reader)
            assert status.startswith(b"HTTP/1.1 500") and headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 5) == b""

    run(go)


def test_http_1_0_client_gets_the_stream_delimited_by_close() -> None:
    """No chunked framing for an HTTP/1.0 client: the body ends with the connection."""

    async def go() -> None:
        p, d = Fake("prefill"), Fake("decode")
        servers = [await start_fake(p), await start_fake(d)]
        try:
            config = ProxyConfig(host="127.0.0.1", port=0, prefill=[p.url], decode=[d.url], health_interval_s=0.05)
            async with serving(config) as proxy:
                async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{proxy.port}") as client:
                    await wait_health(client, 200)
                reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
                body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True}).encode()
                writer.write(b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
                raw = await asyncio.wait_for(reader.read(), 10)
                head, _, payload = raw.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding" not in head
                assert b"Connection: close" in head
                assert payload == b"".join(CHUNKS) + DONE
        finally:
            for s in servers:
                await s.close()

    run(go)
