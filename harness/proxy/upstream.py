"""A lean HTTP/1.1 client for the two upstream legs (the proxy's hot path).

aiohttp's client spends most of the proxy's CPU per request on objects the proxy does
not need (cookie jars, tracing, redirects, per-request timer contexts). This client
writes a request in one send, parses responses with llhttp (httptools), keeps
connections alive per backend, and enforces a total deadline and a stream idle
timeout with one timer per request. Health checks and /v1/models stay on aiohttp.

Not shared with the bench client (harness.bench.client), on purpose: the proxy relays
bytes with backpressure and never looks inside the stream, while the client's job is to
timestamp each read and decode its SSE events; one module for both would add the other's
work to each hot path (see the client's docstring).
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections import deque

import httptools

from harness.limits import local_cause

# Pause reading a response when this much is buffered and the client is slower
# than the backend (memory stays bounded).
HIGH_WATER = 1 << 20


# A leg that failed on the proxy's own side (descriptors, memory): the backend is not at fault.
LOCAL = "proxy_resources"


class UpstreamFailure(Exception):
    """Connecting, sending or receiving failed; `kind` says which way."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # connection_error | timeout | stream_idle_timeout | proxy_resources (LOCAL)


class Response:
    """One upstream response: status and headers, then its (de-chunked) body."""

    __slots__ = (
        "_chunks",
        "_deadline",
        "_done",
        "_exc",
        "_head",
        "_idle",
        "_last",
        "_paused",
        "_size",
        "_timer",
        "_waiter",
        "conn",
        "content_length",
        "content_type",
        "status",
    )

    def __init__(self, conn: _Conn, deadline: float, idle: float | None) -> None:
        self.conn = conn
        self.status = 0
        self.content_type = "application/json"
        self.content_length: int | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._exc: BaseException | None = None
        self._head: asyncio.Future[None] = conn.loop.create_future()
        self._deadline = deadline
        self._idle = idle
        self._last = conn.loop.time()
        self._paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._arm()

    # -- timers: one handle per request, re-armed only when it fires --------

    def _arm(self) -> None:
        due = self._deadline
        if self._idle is not None:
            # While reading is paused, the proxy's client is the slow side: wait a full period.
            last = self.conn.loop.time() if self._paused else self._last
            due = min(due, last + self._idle)
        self._timer = self.conn.loop.call_at(due, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._done or self._exc is not None:
            return
        now = self.conn.loop.time()
        if now >= self._deadline:
            self._fail(UpstreamFailure("timeout", "total time limit exceeded"))
        elif self._idle is not None and now - self._last >= self._idle and not self._paused:
            self._fail(UpstreamFailure("stream_idle_timeout", f"no data for {self._idle:g}s"))
        else:
            self._arm()

    # -- fed by the connection ------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and not self._paused:
            self._paused = True
            self.conn.pause()
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _finish(self) -> None:
        self._done = True
        self._stop_timer()
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._done or self._exc is not None:
            return
        self._exc = exc
        self._stop_timer()
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: nobody may be waiting any more
        w = self._waiter
        if w is not None and not w.done():
            w.set_exception(exc)
        self.conn.close()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- read by the proxy ------------------------------------------------------

    async def read_chunk(self) -> bytes:
        """Whatever body bytes arrived (waiting for some); b"" at the end."""
        while True:
            if self._chunks:
                data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
                self._chunks.clear()
                self._size = 0
                if self._paused:
                    self._paused = False
                    self._last = self.conn.loop.time()  # the idle clock restarts with reading
                    self.conn.resume()
                return data
            if self._exc is not None:
                raise self._exc
            if self._done:
                return b""
            self._waiter = self.conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    @property
    def at_eof(self) -> bool:
        return self._done and not self._chunks

    async def read(self, cap: int) -> bytes:
        """The whole body, at most `cap` bytes (UpstreamFailure beyond)."""
        if self.content_length is not None and self.content_length > cap:
            raise UpstreamFailure("connection_error", f"response of {self.content_length} bytes exceeds {cap}")
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = await self.read_chunk()
            if not chunk:
                return b"".join(parts)
            size += len(chunk)
            if size > cap:
                raise UpstreamFailure("connection_error", f"response exceeds {cap} bytes")
            parts.append(chunk)

    def close(self) -> None:
        """Done with this response: unfinished, its connection is dropped (the backend aborts)."""
        self._stop_timer()
        if not self._done:
            self._fail(UpstreamFailure("connection_error", "closed by the proxy"))
            self.conn.close()


class _Conn(asyncio.Protocol):
    """One keep-alive connection to a backend, parsing with llhttp."""

    def __init__(self, pool: _HostPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.closed = False
        self.used = False  # has carried a request before (may be stale when reused)
        self.got_data = False
        self._header_name = b""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:  # bytes with no request outstanding: the connection is unusable
            self.close()
            return
        self.got_data = True
        resp._last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            resp._fail(UpstreamFailure("connection_error", f"bad HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self.resp
        if resp is not None and not resp._done:
            msg = "server disconnected" + (f": {exc}" if exc else "")
            resp._fail(UpstreamFailure("connection_error", msg))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        # Only the two headers the proxy relays or needs; the rest are skipped unparsed.
        n = name.lower()
        if n == b"content-type":
            self.resp.content_type = value.decode("latin-1")  # type: ignore[union-attr]
        elif n == b"content-length" and value.isdigit():
            self.resp.content_length = int(value)  # type: ignore[union-attr]

    def on_headers_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        resp.status = self.parser.get_status_code()
        if not resp._head.done():
            resp._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        assert self.resp is not None
        self.resp._feed(body)

    def on_message_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        keep = self.parser.should_keep_alive()
        self.resp = None
        resp._finish()
        if keep and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    # helpers
    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class _HostPool:
    def __init__(self, client: UpstreamClient, host: str, port: int, use_ssl: bool) -> None:
        self.client = client
        self.host, self.port, self.use_ssl = host, port, use_ssl
        self.idle: deque[_Conn] = deque()

    def release(self, conn: _Conn) -> None:
        if len(self.idle) < self.client.max_idle:
            self.idle.append(conn)
        else:
            conn.close()

    async def acquire(self, connect_timeout: float) -> _Conn:
        while self.idle:
            conn = self.idle.pop()  # most recently used: least likely to be stale
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        ctx = ssl_module.create_default_context() if self.use_ssl else None
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self, loop), self.host, self.port, ssl=ctx),
                connect_timeout,
            )
        except asyncio.TimeoutError:
            raise UpstreamFailure("connection_error", f"connect timed out after {connect_timeout:g}s") from None
        except OSError as exc:
            if local_cause(exc) is not None:  # ours (e.g. out of descriptors), not the backend's
                raise UpstreamFailure(LOCAL, f"the proxy ran out of a resource of its own: {exc}") from None
            raise UpstreamFailure("connection_error", f"cannot connect: {exc}") from None
        return conn

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class UpstreamClient:
    """Keep-alive pools per backend; `post` returns once the response headers are in."""

    def __init__(self, connect_timeout: float, max_idle: int = 1024) -> None:
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.pools: dict[tuple[str, int, bool], _HostPool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _pool(self, host: str, port: int, use_ssl: bool) -> _HostPool:
        key = (host, port, use_ssl)
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = _HostPool(self, host, port, use_ssl)
        return pool

    async def post(
        self,
        host: str,
        port: int,
        path: str,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
        idle: float | None = None,
        use_ssl: bool = False,
    ) -> Response:
        """POST `body`; the returned Response must be read to the end or closed."""
        pool = self._pool(host, port, use_ssl)
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        head = [f"POST {path} HTTP/1.1\r\nHost: {netloc}\r\nContent-Length: {len(body)}\r\n"]
        head.extend(f"{k}: {v}\r\n" for k, v in headers.items())
        head.append("\r\n")
        data = "".join(head).encode("latin-1") + body
        # The loop is looked up once: CPython 3.11's get_running_loop() makes a getpid
        # syscall on every call (its fork check), two per proxied request here.
        loop = self._loop or self._bind_loop()
        deadline = loop.time() + timeout
        for attempt in (0, 1):
            conn = await pool.acquire(min(self.connect_timeout, timeout))
            reused = conn.used
            conn.used = True
            conn.got_data = False
            resp = Response(conn, deadline, idle)
            conn.resp = resp
            conn.parser = httptools.HttpResponseParser(conn)
            assert conn.transport is not None
            conn.transport.write(data)
            try:
                await resp._head
            except UpstreamFailure as exc:
                # A kept-alive connection the backend closed just as we reused it: the
                # request never reached it, so sending it again on a fresh one is safe.
                if attempt == 0 and reused and not conn.got_data and exc.kind == "connection_error":
                    continue
                raise
            except BaseException:
                resp.close()
                raise
            return resp
        raise AssertionError("unreachable")

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()


def split_url(url: str) -> tuple[str, int, bool]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    use_ssl = parts.scheme == "https"
    return parts.hostname or "", parts.port or (443 if use_ssl else 80), use_ssl
