#!/usr/bin/env python3
"""The floor of a PD proxy on pdbench's event loop: a byte relay that does nothing per token.

uvloop (what `pdbench proxy` runs on, harness/aio.py), asyncio protocols, no tasks per token.
Per client request it does exactly this:

1. reads the request (headers up to the blank line, then Content-Length bytes of body);
   nothing of it is parsed beyond that;
2. writes one fixed, pre-encoded prefill request (`--prefill-body`, sent as is: one token,
   not streamed) to the prefill engine and reads its answer by Content-Length, unparsed
   (its kv_transfer_params are dropped);
3. writes the client's request bytes unchanged to the decode engine (so decode gets no
   kv_transfer_params) and writes every piece of decode's response to the client as it is
   read: same bytes, same chunked framing. Per piece it only checks whether the response
   has ended (the last chunk `0\\r\\n\\r\\n`, or Content-Length bytes).

Each client connection gets its own prefill and decode connection, kept for its life (no
pool, no policy). bench_proxy.py measures it beside the real proxies: what is left of a
proxy's CPU per relayed token once this is taken off is what the proxy itself adds.

    python benchmarks/relay_floor.py --port P --prefill URL --decode URL --prefill-body JSON
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from urllib.parse import urlsplit

_HEAD_END = b"\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 600.0  # a request not answered by then closes its connection


def _head(buf: bytes) -> tuple[bytes, int] | None:
    """(lower-cased head, offset of the body) once the head is complete, else None."""
    end = buf.find(_HEAD_END)
    return None if end < 0 else (buf[:end].lower(), end + len(_HEAD_END))


def _content_length(head: bytes) -> int | None:
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return None
    line = head[at + 17 :].split(b"\r\n", 1)[0]
    return int(line.strip())


class _Upstream(asyncio.Protocol):
    """One upstream connection: `relay` gets every piece read; ended when the response is whole."""

    def __init__(self) -> None:
        self.relay: asyncio.Transport | None = None  # where the bytes go (decode), else kept (prefill)
        self.done: asyncio.Future[None] | None = None
        self.buf = b""
        self.chunked = False
        self.left = -1  # body bytes still due (Content-Length framing); -1: head not seen yet

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def start(self, request: bytes, relay: asyncio.Transport | None) -> asyncio.Future[None]:
        self.relay, self.buf, self.left = relay, b"", -1
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        if self.relay is not None:
            self.relay.write(data)
        if self.left >= 0:  # the head is known: the per-piece path
            if self.chunked:
                if data.endswith(_LAST_CHUNK):
                    self._end()
            else:
                self.left -= len(data)
                if self.left <= 0:
                    self._end()
            return
        self.buf += data
        found = _head(self.buf)
        if found is None:
            return
        head, body_at = found
        self.chunked = b"transfer-encoding: chunked" in head
        if self.chunked:
            self.left = 0
            if self.buf.endswith(_LAST_CHUNK):
                self._end()
            return
        length = _content_length(head)
        if length is None:
            self._fail(ConnectionError("upstream response has neither chunked framing nor Content-Length"))
            return
        self.left = length - (len(self.buf) - body_at)
        if self.left <= 0:
            self._end()

    def _end(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc or ConnectionError("upstream closed before the end of its response"))


class _Client(asyncio.Protocol):
    """One client connection; one request at a time (HTTP/1.1 without pipelining)."""

    def __init__(self, cfg: argparse.Namespace) -> None:
        self.cfg = cfg
        self.buf = b""
        self.prefill: _Upstream | None = None
        self.decode: _Upstream | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        found = _head(self.buf)
        if found is None:
            return
        head, body_at = found
        end = body_at + (_content_length(head) or 0)
        if len(self.buf) < end:
            return
        request, self.buf = self.buf[:end], self.buf[end:]
        self.task = asyncio.ensure_future(self._serve(request))

    async def _connect(self, host: str, port: int) -> _Upstream:
        loop = asyncio.get_running_loop()
        _, proto = await asyncio.wait_for(loop.create_connection(_Upstream, host, port), CONNECT_TIMEOUT_S)
        return proto

    async def _serve(self, request: bytes) -> None:
        cfg = self.cfg
        try:
            # (Re)connect only when needed: an engine may close an idle keep-alive connection.
            if self.prefill is None or self.prefill.transport.is_closing():
                self.prefill = await self._connect(*cfg.prefill_addr)
            if self.decode is None or self.decode.transport.is_closing():
                self.decode = await self._connect(*cfg.decode_addr)
            await asyncio.wait_for(self.prefill.start(cfg.prefill_request, None), REQUEST_TIMEOUT_S)
            await asyncio.wait_for(self.decode.start(request, self.transport), REQUEST_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        for up in (self.prefill, self.decode):
            if up is not None:
                up.transport.close()
        if self.task is not None:
            self.task.cancel()


def _addr(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise SystemExit(f"expected http://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port


async def _main(cfg: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(cfg), cfg.host, cfg.port, backlog=4096)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefill", required=True, help="http://HOST:PORT of the prefill engine")
    ap.add_argument("--decode", required=True, help="http://HOST:PORT of the decode engine")
    ap.add_argument("--prefill-body", required=True, help="the JSON body sent to prefill for every request")
    ap.add_argument("--path", default="/v1/completions", help="the prefill request's path")
    cfg = ap.parse_args()
    cfg.prefill_addr, cfg.decode_addr = _addr(cfg.prefill), _addr(cfg.decode)
    body = cfg.prefill_body.encode()
    cfg.prefill_request = (
        f"POST {cfg.path} HTTP/1.1\r\nHost: {cfg.prefill_addr[0]}:{cfg.prefill_addr[1]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    import uvloop

    uvloop.run(_main(cfg))


if __name__ == "__main__":
    main()
