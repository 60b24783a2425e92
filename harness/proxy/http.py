"""The proxy's HTTP/1.1 server: an asyncio protocol over llhttp (httptools), no framework.

Deliberately not aiohttp's server: with it, its request/response machinery was about
half of the proxy's CPU per request (bench_proxy.py at c=64: 413 us per request against
234 us for the same two legs behind this protocol). The proxy needs little of a web
framework: parse one request at a time per connection (keep-alive; pipelined requests
wait their turn), hand it to a route's handler, write a whole reply in one send or a
stream with backpressure, and cancel the handler when the client goes away (the proxy
then drops its upstream legs, which makes vLLM abort the request).

Bounded: a connection idle (or sending a request) for `keepalive_s` is closed (one sweep
per server checks them all: a timer per request cost as much as parsing it); a body over
`max_body` is read and discarded, and the handler sees `too_large` (the proxy answers 413
and closes). A request's head is bounded before it is buffered (llhttp has no limit, and
httptools keeps a header's pieces until it ends): a URL over MAX_URL is answered 414, a head
(request line and headers) over MAX_HEAD bytes or with more than MAX_HEADERS headers 431,
and the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import httptools

from harness.proxy.flows import dumps

log = logging.getLogger(__name__)

KEEPALIVE_S = 75.0  # aiohttp's and nginx's default
# Limits of a request's head. A URL: nginx's default line buffer (large_client_header_buffers
# 8k); the whole head: four times h11's 16 KiB (uvicorn's default), room for long tokens in
# headers; the header count: hyper's (vllm-router's HTTP server) default of 100.
MAX_URL = 8 * 1024
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
LINGER_S = 2.0  # after refusing a request, what the client still sends is read and dropped this long


class _Refused(Exception):
    """Raised in an llhttp callback to stop parsing a request the limits refuse."""


class Request:
    """One parsed request: headers by lower-case name, the whole body."""

    __slots__ = ("body", "headers", "http11", "keep_alive", "method", "path", "too_large")

    def __init__(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        keep_alive: bool,
        http11: bool,
        too_large: bool,
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http11 = http11
        self.too_large = too_large  # the body exceeded the limit and was dropped

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isdigit() else None


class Reply:
    """A whole response, written in one send."""

    __slots__ = ("body", "close", "content_type", "headers", "status")

    def __init__(
        self,
        body: bytes,
        status: int = 200,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        self.body = body
        self.status = status
        self.content_type = content_type
        self.headers = headers
        self.close = close  # end the connection after it


def json_reply(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    return Reply(dumps(obj), status, "application/json", headers)


_PHRASES = {s.value: s.phrase for s in HTTPStatus}


def _head(status: int, content_type: str, headers: dict[str, str] | None, framing: str, close: bool) -> bytes:
    phrase = _PHRASES.get(status, "Unknown")
    parts = [f"HTTP/1.1 {status} {phrase}\r\nContent-Type: {content_type}\r\n{framing}"]
    if headers:
        parts.extend(f"{k}: {v}\r\n" for k, v in headers.items())
    if close:
        parts.append("Connection: close\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1")


class Stream:
    """A response whose body follows in pieces: chunked, or as long as `content_length`.

    The head waits to go out with the first piece (one send instead of two)."""

    __slots__ = ("_chunked", "_conn", "_pending", "content_type", "status")

    def __init__(self, conn: HttpConnection, head: bytes, chunked: bool, status: int, content_type: str) -> None:
        self._conn = conn
        self._pending: bytes | None = head
        self._chunked = chunked
        self.status = status
        self.content_type = content_type

    def _send(self, data: bytes) -> None:
        transport = self._conn.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client disconnected")
        if self._pending is not None:
            data = self._pending + data
            self._pending = None
        transport.write(data)

    async def write(self, data: bytes) -> None:
        """Send `data` (non-empty); waits while the client reads slower than we write."""
        self._send(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        if self._conn.write_paused:
            await self._conn.drain()

    def end(self, last: bytes = b"") -> None:
        """The body is complete (with `last` as its final piece, in the same send)."""
        if self._chunked:
            self._send((b"%x\r\n%b\r\n0\r\n\r\n" % (len(last), last)) if last else b"0\r\n\r\n")
        elif last or self._pending is not None:
            self._send(last)
        self._conn.response_done()

    def abort(self) -> None:
        """End the connection without the final chunk: the client sees a truncated body
        (what was written before, an error event say, still goes out first)."""
        self._conn.cut()


Handler = Callable[[Request, "HttpConnection"], Awaitable["Reply | Stream"]]


class HttpServer:
    """Routes and the connections of one listening socket (or several, one loop)."""

    def __init__(
        self,
        routes: dict[tuple[str, str], Handler],
        max_body: int,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self.routes = routes
        self.paths = {path for _, path in routes}
        self.max_body = max_body
        self.keepalive_s = keepalive_s
        self.connections: set[HttpConnection] = set()

    def protocol(self) -> HttpConnection:
        return HttpConnection(self)

    async def sweep(self) -> None:
        """Close connections idle for longer than `keepalive_s` (runs until cancelled)."""
        loop = asyncio.get_running_loop()
        period = min(max(self.keepalive_s / 4, 0.01), 5.0)
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for conn in list(self.connections):
                if conn.task is None and now - conn.idle_since > self.keepalive_s:
                    conn.cut()

    def close_all(self) -> None:
        """Cancel every handler and drop every connection (shutdown)."""
        for conn in list(self.connections):
            conn.abort()


class HttpConnection(asyncio.Protocol):
    """One client connection: llhttp callbacks in, one handler task at a time."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Request] = deque()
        self.task: asyncio.Task[None] | None = None
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self.idle_since = self.loop.time()  # since the last response (or the connection) began
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._too_large = False
        self._closing = False  # no further requests are read (an error answer, Connection: close)
        self._answered = False  # the current request's response has begun
        self._in_head = True  # reading a request's line and headers (bounded: MAX_HEAD)
        self._head_read = 0  # bytes read while in the head: counts a header that never ends
        self._head_size = 0  # the head's URL and header bytes parsed so far
        self._header_count = 0
        self._refusal: tuple[int, str] | None = None  # why a callback stopped the parser

    # -- asyncio.Protocol -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._in_head:
            self._head_read += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported")
            return
        except httptools.HttpParserError as exc:
            self._refuse(*(self._refusal or (400, f"malformed HTTP request: {exc}")))
            return
        if self._in_head and self._head_read > MAX_HEAD:  # a header still growing (llhttp buffers it)
            self._refuse(431, f"request head over {MAX_HEAD} bytes")

    def _limit(self, status: int, message: str) -> None:
        """Stop parsing this request: answered `status` (by data_received) and closed."""
        self._refusal = (status, message)
        raise _Refused(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        self.queue.clear()
        if self.task is not None:
            self.task.cancel()  # the client is gone: so is the handler (and its upstream legs)
        self._wake(ConnectionResetError("the client disconnected"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake(None)

    # -- llhttp callbacks -----------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._size = 0
        self._too_large = False
        self._in_head = True
        self._head_size = self._header_count = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if len(self._url) > MAX_URL:
            self._limit(414, f"URL over {MAX_URL} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._head_size += len(name) + len(value)
        if self._header_count > MAX_HEADERS:
            self._limit(431, f"more than {MAX_HEADERS} request headers")
        if self._head_size > MAX_HEAD:
            self._limit(431, f"request head over {MAX_HEAD} bytes")
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_read = 0
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body:
            self._too_large = True
        elif self._headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return  # read and dropped: the answer is 413 either way
        self._size += len(body)
        if self._size > self.server.max_body:
            self._too_large = True
            self._body = []
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_head, self._head_read = True, 0  # what follows is the next request's head
        p = self.parser
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        request = Request(
            p.get_method().decode("latin-1"),
            path,
            self._headers,
            body,
            p.should_keep_alive(),
            p.get_http_version() == "1.1",
            self._too_large,
        )
        if self.task is None:
            self._start(request)
        else:  # pipelined: wait for the one in progress; read no more meanwhile
            self.queue.append(request)
            if self.transport is not None:
                self.transport.pause_reading()

    # -- serving ----------------------------------------------------------------

    def _start(self, request: Request) -> None:
        self._answered = False
        self.task = self.loop.create_task(self._serve(request))

    async def _serve(self, request: Request) -> None:
        server = self.server
        keep = request.keep_alive
        try:
            handler = server.routes.get((request.method, request.path))
            result: Reply | Stream
            if handler is not None:
                result = await handler(request, self)
            elif request.path in server.paths:
                allowed = ", ".join(sorted(m for m, p in server.routes if p == request.path))
                result = _error(405, f"{request.method} is not allowed here", "method_not_allowed")
                result.headers = {"Allow": allowed}
            else:
                result = _error(404, f"no route {request.path}", "not_found")
            if isinstance(result, Reply):
                keep = keep and not result.close and not request.too_large
                self._write_reply(result, keep)
            elif not self._answered:  # a stream the handler never ended: the response is cut
                keep = False
        except asyncio.CancelledError:
            raise
        except Exception:  # a handler bug never takes the connection's other requests with it
            log.exception("unexpected error serving %s %s", request.method, request.path)
            keep = False
            if not self._answered and self.transport is not None:
                self._write_reply(_error(500, "internal proxy error (see the proxy log)", "internal_error"), False)
        finally:
            self.task = None
        if self.transport is None:
            return
        if not keep or self._closing:
            self.transport.close()
        elif self.queue:
            self.transport.resume_reading()
            self._start(self.queue.popleft())
        else:
            self.idle_since = self.loop.time()

    def _write_reply(self, reply: Reply, keep: bool) -> None:
        self._answered = True
        if self.transport is None:
            return
        framing = f"Content-Length: {len(reply.body)}\r\n"
        self.transport.write(_head(reply.status, reply.content_type, reply.headers, framing, not keep) + reply.body)

    def stream(
        self,
        request: Request,
        status: int,
        content_type: str,
        headers: dict[str, str] | None = None,
        content_length: int | None = None,
    ) -> Stream:
        """Begin a streamed response; its head leaves with the first piece of the body."""
        if content_length is not None:
            framing, chunked = f"Content-Length: {content_length}\r\n", False
        elif request.http11:
            framing, chunked = "Transfer-Encoding: chunked\r\n", True
        else:  # HTTP/1.0: the end of the body is the end of the connection
            framing, chunked = "", False
            request.keep_alive = False
        close = not request.keep_alive
        return Stream(self, _head(status, content_type, headers, framing, close), chunked, status, content_type)

    def response_done(self) -> None:
        self._answered = True

    def cut(self) -> None:
        """Close after what is already written; no further requests on this connection."""
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Shutdown: cancel the handler and drop the connection at once."""
        self._closing = True
        if self.task is not None:
            self.task.cancel()
        if self.transport is not None:
            self.transport.abort()

    def _refuse(self, status: int, message: str) -> None:
        """A request we cannot parse: answer (unless one is being answered) and close."""
        self._closing = True
        if self.transport is None:
            return
        if self.task is None:
            self._write_reply(_error(status, message, "invalid_request_error"), False)
            self._linger()
        # else: the handler in progress finishes, then the connection closes

    def _linger(self) -> None:
        """End our side after the answer, and read (and drop) what the client still sends for
        LINGER_S before closing: closed at once with its bytes unread, the kernel would reset the
        connection and the client could lose the answer (nginx's lingering close)."""
        transport = self.transport
        if transport is None:
            return
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_S, self.cut)
        else:
            transport.close()

    # -- waits ----------------------------------------------------------------------

    async def drain(self) -> None:
        if not self.write_paused:
            return
        if self.transport is None:
            raise ConnectionResetError("the client disconnected")
        self._drain = self.loop.create_future()
        try:
            await self._drain
        finally:
            self._drain = None

    def _wake(self, exc: BaseException | None) -> None:
        w = self._drain
        if w is not None and not w.done():
            if exc is None:
                w.set_result(None)
            else:
                w.set_exception(exc)


def _error(status: int, message: str, kind: str) -> Reply:
    return json_reply({"error": {"message": message, "type": kind, "backend": None, "code": status}}, status)
