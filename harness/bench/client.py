"""Streaming requests against an OpenAI-compatible endpoint, timed per received chunk.

Timing follows vLLM's `async_request_openai_completions`: start when the request
is sent, TTFT at the first SSE event carrying `choices` (its text may be empty, e.g.
for special tokens), one ITL entry per later such event, latency at the last one.
Stricter than vLLM: a stream without `data: [DONE]`, with an `{"error": ...}` event or
with a JSON payload that does not parse fails the request with that message, so a
truncated stream is never counted as a success.

Speed (the client must never be what limits a benchmark): instead of aiohttp, each
in-flight slot owns one keep-alive HTTP/1.1 connection driven by an asyncio Protocol,
its framing read by llhttp (httptools). Request bytes are built before the clock
starts; every read from the socket is parsed in one go: one clock reading, and all its
complete SSE events decoded by a single `json.loads` of a JSON array. Events that
arrive in the same read therefore share one timestamp (ITL 0 between them); vLLM's
client reads the clock once per event of such a read, which differs only by its own
parsing time.

Why not the proxy's client (harness.proxy.upstream)? Both frame HTTP with llhttp, but
each side is built for its own hot path, and sharing would slow one of them: this one
times every socket read and parses its SSE events in one batch (the measurement), while
the proxy's relays response bytes untouched with backpressure and never parses SSE (the
forwarding). Both are kept lean and measured: benchmarks/bench_client_cpu.py,
benchmarks/bench_client_capacity.py and benchmarks/bench_proxy.py.
"""

from __future__ import annotations

import asyncio
import json
import ssl as ssl_lib
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools

try:  # optional: faster, same results
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads  # type: ignore[assignment]  # same contract as orjson.loads


@dataclass
class RequestOutput:
    prompt_len: int
    expected_output_len: int
    success: bool = False
    output_tokens: int = 0
    ttft: float = 0.0  # s
    itl: list[float] = field(default_factory=list)  # s, gaps between content events
    latency: float = 0.0  # s, send to last content event
    start_time: float | None = None  # perf_counter at send; None if never sent
    end_time: float | None = None  # perf_counter when the request finished or failed
    error: str = ""
    queue_time: float = 0.0  # s, arrival to send: the wait for a free slot (vLLM's queue_times)
    # Sent by a load process that died before it reported the request (harness.bench.workers):
    # it left, but when and how it ended died with the process. It counts as failed.
    lost: bool = False

    @property
    def sent(self) -> bool:
        """Whether the request left the client (a request never sent is neither completed nor failed)."""
        return self.start_time is not None or self.lost


@dataclass
class TextOutput(RequestOutput):
    """A request whose answer's text is kept (a session's next turn carries it): only a `Slot`
    made with keep_text fills it, so the independent requests' path never decodes text."""

    text: str = ""
    server_prompt_tokens: int | None = None  # the server's usage.prompt_tokens, when it sent one


class RequestFailed(Exception):
    """A response that arrived but cannot count as a success."""


def build_payload(
    endpoint: str,
    model: str,
    prompt: str | list[dict[str, str]],
    max_tokens: int,
    ignore_eos: bool,
    sampling: dict[str, float | int] | None = None,
) -> dict[str, Any]:
    """A streamed request's body; `prompt` for chat may be a conversation's messages (sessions).
    `sampling`: temperature, top_p, top_k as given (ClientConfig.sampling); greedy without it."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    } | (sampling or {})
    if endpoint == "chat":
        # The chat template adds tokens, so the server-side prompt is longer than isl.
        body["messages"] = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    elif isinstance(prompt, str):
        body["prompt"] = prompt
    else:
        raise ValueError("a messages list is for the chat endpoint only")
    return body


def _error_text(msg: dict[str, Any]) -> str | None:
    """vLLM streams errors as {"error": {...}}; some servers send {"object": "error"}."""
    if msg.get("error"):
        err = msg["error"]
        return json.dumps(err) if not isinstance(err, str) else err
    if msg.get("object") == "error":
        return str(msg.get("message", msg))
    return None


def _is_content_chunk(msg: dict[str, Any]) -> bool:
    choices = msg.get("choices")
    if not choices:
        return False  # e.g. the final usage-only chunk
    delta = choices[0].get("delta")
    if delta is None:
        return True  # completions: every choices chunk is a generated token
    # chat: skip the role-announcement chunk that carries no generated text
    return not (delta.get("role") and not delta.get("content") and not delta.get("reasoning_content"))


def usage_mismatch(usage: Any, events: int, max_tokens: int) -> str | None:
    """Why a successful stream's `usage.completion_tokens` cannot be true, or None; checked once per
    request, when its response is complete (never per event). The rule never refuses real vLLM
    output: vLLM streams one event per engine step that made tokens for the request (one token by
    default; several with speculative decoding or --stream-interval; a step whose text the
    detokenizer holds back still sends its event), so a stream has no more content events than
    tokens, and vLLM never makes more than max_tokens. One event more than the tokens is allowed:
    a closing event that carries only the finish reason (some servers send one). So the count is
    refused when it is over max_tokens (when known: > 0), under 1 (a success has a content event),
    under the content events less one, or not an integer."""
    if not isinstance(usage, int) or isinstance(usage, bool):
        return f"usage.completion_tokens is not an integer: {usage!r:.40}"
    if max_tokens > 0 and usage > max_tokens:
        return f"usage.completion_tokens {usage} is more than the {max_tokens} asked for (max_tokens)"
    if usage < 1 or usage < events - 1:
        return f"usage.completion_tokens {usage} is fewer than the {events} content events streamed"
    return None


# -- target URL and request bytes ------------------------------------------------


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    ssl: ssl_lib.SSLContext | None
    host_header: str
    # Sent with every request (an API key's Authorization, `--header`); never written to a file.
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @classmethod
    def from_url(cls, url: str, headers: dict[str, str] | None = None) -> Target:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        tls = u.scheme == "https"
        port = u.port or (443 if tls else 80)
        host = u.hostname
        shown = f"[{host}]" if ":" in host else host
        default = (tls and port == 443) or (not tls and port == 80)
        return cls(
            host=host,
            port=port,
            path=(u.path or "/") + (f"?{u.query}" if u.query else ""),
            ssl=ssl_lib.create_default_context() if tls else None,
            host_header=shown if default else f"{shown}:{port}",
            headers=tuple((headers or {}).items()),
        )

    def request_bytes(self, payload: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
        """A complete POST with a JSON body, keep-alive."""
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (dict(self.headers) | (headers or {})).items())
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("latin-1") + body


# -- one HTTP/1.1 exchange: llhttp frames it, the SSE events are decoded here ------

MAX_ERROR_BODY = 500


class _After(Exception):
    """Raised in llhttp's callback to stop it at bytes that follow the complete response."""


class _Framing:
    """llhttp's parser for one connection, kept from response to response (one per request
    cost the client about 2 % more CPU per request at ITL 0): it reads the status, headers
    and chunked/length/close framing and hands them to the exchange in flight."""

    __slots__ = ("ex", "on_body", "parser", "pieces")
    # Not needed; a class attribute spares the parser's lookup an AttributeError each.
    on_chunk_header = on_chunk_complete = None

    def __init__(self) -> None:
        self.ex: _Exchange | None = None
        # llhttp hands each body piece to list.append (no Python frame per piece); the
        # exchange then decodes all the pieces of one read together.
        self.pieces: list[bytes] = []
        self.on_body = self.pieces.append
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        ex = self.ex
        if ex is None or ex.complete:
            raise _After
        ex.reason, ex.framed = "", False

    # The callbacks below come only between on_message_begin and the response's end.
    def on_status(self, reason: bytes) -> None:
        ex = self.ex
        assert ex is not None
        ex.reason += reason.decode("latin-1")  # llhttp may hand it over in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            ex = self.ex
            assert ex is not None
            ex.framed = True

    def on_headers_complete(self) -> None:
        ex = self.ex
        assert ex is not None
        status = self.parser.get_status_code()
        if status >= 200:  # not an interim response (the real one follows those)
            ex.status = status
            if not ex.framed:
                ex.keep_alive = False  # the body ends when the server closes

    def on_message_complete(self) -> None:
        ex = self.ex
        assert ex is not None
        if ex.status:
            ex.complete = True
            ex.keep_alive = ex.keep_alive and self.parser.should_keep_alive()


class _Exchange:
    """Parse one response into `out`: its connection's `_Framing` reads the HTTP framing;
    the body bytes of each socket read are decoded here."""

    __slots__ = (
        "chat",
        "chunks",
        "complete",
        "done",
        "err_body",
        "failure",
        "framed",
        "framing",
        "fut",
        "keep_alive",
        "last",
        "out",
        "reason",
        "sse",
        "status",
        "usage_tokens",
    )

    def __init__(
        self, out: RequestOutput, chat: bool, fut: asyncio.Future[None], framing: _Framing | None = None
    ) -> None:
        self.out = out
        self.chat = chat
        self.fut = fut
        self.status = 0  # set once the final (non-1xx) response's headers are complete
        self.reason = ""
        self.keep_alive = True
        self.framed = False  # chunked or Content-Length: the body's end is in the bytes
        self.complete = False
        self.sse = b""
        self.err_body = b""
        self.chunks = 0
        self.last = 0.0
        self.usage_tokens: int | None = None
        self.done = False  # saw data: [DONE]
        self.failure: str | None = None  # the first reason this request fails
        self.framing = framing = framing or _Framing()
        framing.ex = self

    # The protocol feeds raw bytes; returns True when the response is complete.
    def feed(self, data: bytes, now: float) -> bool:
        framing = self.framing
        try:
            framing.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if not self.complete:
                raise RequestFailed(f"{e}; the read began {data[:60]!r}") from None
            self.keep_alive = False  # bytes after the response: do not trust this connection
        pieces = framing.pieces
        if pieces:
            body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            if self.sse or not self._one_chunk(body, now):
                self._body(body, now)
        if self.complete:
            framing.ex = None  # it refers back to self: freed now, not by the cycle collector
            self._finish()
        return self.complete

    def _one_chunk(self, data: bytes, now: float) -> bool:
        """The streamed decode's usual read: one whole `data: {...}` event. Handled here
        with a fraction of the general path's work; False (nothing done) for anything else,
        which then takes the general path."""
        if (
            self.status != 200
            or self.done
            or self.failure
            or not data.startswith(b"data: {")
            or not data.endswith(b"\n\n")
        ):
            return False
        # One event on one line; searched in place, as a body of many events must not be copied.
        if data.find(b"\n", 7, -2) >= 0 or b"\r" in data:
            return False
        try:
            msg = _loads(data[6:-2])
        except ValueError:
            return False  # the general path records the failure
        # Error and usage events take the general path; checked on the parsed object, as
        # two dict lookups cost less than two more scans of the bytes.
        if type(msg) is not dict or "error" in msg or msg.get("usage") or msg.get("object") == "error":
            return False
        if _is_content_chunk(msg) if self.chat else msg.get("choices"):
            out = self.out
            if self.chunks == 0:
                out.ttft = now - out.start_time  # type: ignore[operator]
            else:
                out.itl.append(now - self.last)
            self.chunks += 1
            self.last = now
        return True

    def _body(self, data: bytes, now: float) -> None:
        if self.status != 200:
            if len(self.err_body) < MAX_ERROR_BODY:
                self.err_body += data[: MAX_ERROR_BODY - len(self.err_body)]
            return
        if self.done or self.failure is not None:
            return  # after [DONE] or a failure, the rest is drained unparsed
        buf = self.sse + data if self.sse else data
        if b"\r" in buf:
            # SSE also allows CR LF and CR line ends; keep a trailing CR, its LF may follow.
            hold = buf.endswith(b"\r")
            buf = (buf[:-1] if hold else buf).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if hold:
                buf += b"\r"
        end = buf.rfind(b"\n\n")
        if end < 0:
            self.sse = buf
            return
        self.sse = buf[end + 2 :]
        self._events(buf[:end], now)

    def _events(self, block: bytes, now: float) -> None:
        """Handle complete SSE events (separated by blank lines, the last one's omitted)."""
        payloads = block[6:].split(b"\n\ndata: ")
        if not block.startswith(b"data: ") or block.count(b"\n") != 2 * (len(payloads) - 1):
            payloads = _payloads(block)  # not the usual one `data: ` line per event
        if b"[DONE]" in block and b"[DONE]" in payloads:
            payloads = payloads[: payloads.index(b"[DONE]")]
            self.done = True
        if not payloads:
            return
        try:
            # One event per read is the common case of a streamed decode: no array to build.
            msgs = [_loads(payloads[0])] if len(payloads) == 1 else _loads(b"[" + b",".join(payloads) + b"]")
        except ValueError:
            bad = next((p for p in payloads if not _parses(p)), payloads[0])
            self.failure = f"invalid JSON in stream: {bad[:200]!r}"
            return
        # Byte-level pre-checks skip per-event work that cannot apply: an error event
        # has the word "error" somewhere, a usage the key "usage".
        try:
            if b"error" in block:
                for msg in msgs:
                    if ("error" in msg or msg.get("object") == "error") and (err := _error_text(msg)) is not None:
                        self.failure = f"error in stream: {err}"
                        return
            new = 0
            if self.chat:
                for msg in msgs:
                    if _is_content_chunk(msg):
                        new += 1
            else:
                for msg in msgs:
                    if msg.get("choices"):
                        new += 1
            if b'"usage"' in block:
                for msg in reversed(msgs):
                    if usage := msg.get("usage"):
                        self.usage_tokens = usage.get("completion_tokens")
                        break
        except (AttributeError, TypeError):  # an event that is not a JSON object
            odd = next((m for m in msgs if not isinstance(m, dict)), msgs)
            self.failure = f"unexpected event in stream: {json.dumps(odd)[:200]}"
            return
        if new:
            out = self.out
            if self.chunks == 0:
                out.ttft = now - out.start_time  # type: ignore[operator]
            else:
                out.itl.append(now - self.last)
            if new > 1:
                out.itl.extend([0.0] * (new - 1))
            self.chunks += new
            self.last = now

    def _finish(self) -> None:
        """The HTTP response is complete: decide success."""
        out = self.out
        if self.status != 200:
            body = self.err_body.decode("utf-8", "replace")
            self.failure = self.failure or f"HTTP {self.status} {self.reason}: {body}"
        elif self.failure is None:
            if self.sse.strip() and not self.done:
                self._events(self.sse.rstrip(b"\n"), self.last or time.perf_counter())
            if self.failure is None and not self.done:
                self.failure = "stream ended without data: [DONE]"
            elif self.failure is None and self.chunks == 0:
                self.failure = "stream had no content chunk"
        if self.failure is None and self.usage_tokens is not None:
            self.failure = usage_mismatch(self.usage_tokens, self.chunks, out.expected_output_len)
        if self.failure is None:
            out.latency = self.last - out.start_time  # type: ignore[operator]
            out.output_tokens = self.usage_tokens if self.usage_tokens is not None else self.chunks
            out.success = True
        else:
            out.error = self.failure

    def closed(self) -> str:
        """The connection closed before the response was complete: the reason."""
        if self.status and not self.framed:  # a body that ends when the server closes
            self.complete = True
            self._finish()
            return ""
        if self.status == 0:
            return "server closed the connection before responding"
        return "server closed the connection before the response ended"


class _TextExchange(_Exchange):
    """An exchange that also keeps the answer's text and the server's prompt token count. Every
    read takes the general path (_events), which this decodes a second time for the text: the
    plain _Exchange, the measured hot path of independent requests, is left as it is."""

    __slots__ = ("parts", "prompt_tokens")

    def __init__(self, out: TextOutput, chat: bool, fut: asyncio.Future[None], framing: _Framing | None = None) -> None:
        super().__init__(out, chat, fut, framing)
        self.parts: list[str] = []
        self.prompt_tokens: int | None = None

    def _one_chunk(self, data: bytes, now: float) -> bool:
        return False

    def _events(self, block: bytes, now: float) -> None:
        if not self.done and self.failure is None:
            self._keep_text(block)
        super()._events(block, now)

    def _keep_text(self, block: bytes) -> None:
        for payload in _payloads(block):
            if payload == b"[DONE]":
                return
            try:
                msg = _loads(payload)
            except ValueError:
                return  # _events records the failure
            if type(msg) is not dict:
                return
            if usage := msg.get("usage"):
                self.prompt_tokens = usage.get("prompt_tokens")
            choices = msg.get("choices")
            if not choices or type(choices[0]) is not dict:
                continue
            choice = choices[0]
            piece = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
            if isinstance(piece, str):
                self.parts.append(piece)

    def _finish(self) -> None:
        super()._finish()
        out = self.out
        assert isinstance(out, TextOutput)
        out.text = "".join(self.parts)
        out.server_prompt_tokens = self.prompt_tokens


def _payloads(block: bytes) -> list[bytes]:
    """General SSE: data lines joined with LF per event; comments and other fields skipped."""
    out: list[bytes] = []
    for event in block.split(b"\n\n"):
        data = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if data:
            out.append(b"\n".join(data).strip())
    return out


def _parses(payload: bytes) -> bool:
    try:
        json.loads(payload)
    except ValueError:
        return False
    return True


# -- connections ------------------------------------------------------------------


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.framing = _Framing()
        self.exchange: _Exchange | None = None
        self.open = False
        self.idle_since = 0.0
        self.abort_reason: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:
            self.open = False  # unsolicited bytes: drop the connection
            self.transport.close()  # type: ignore[union-attr]
            return
        try:
            complete = ex.feed(data, time.perf_counter())
        except (RequestFailed, ValueError) as e:
            self._fail(ex, f"bad HTTP response: {e}")
            return
        if not complete and ex.failure is not None:
            # An error event (or a bad payload) ends this request now, whatever follows.
            self._fail(ex, ex.failure)
            return
        if complete:
            self.exchange = None
            if not ex.keep_alive:
                self.open = False
                self.transport.close()  # type: ignore[union-attr]
            if not ex.fut.done():
                ex.fut.set_result(None)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.framing.ex = None  # an exchange that ended early: break its cycle with the framing
        ex = self.exchange
        if ex is not None:
            self.exchange = None
            reason = self.abort_reason or ex.closed()
            if reason:
                if exc is not None and not self.abort_reason:
                    reason += f" ({type(exc).__name__}: {exc})"
                ex.out.error = reason
            if not ex.fut.done():
                ex.fut.set_result(None)

    def _fail(self, ex: _Exchange, reason: str) -> None:
        self.exchange = None
        ex.out.error = reason
        self.open = False
        self.transport.abort()  # type: ignore[union-attr]
        if not ex.fut.done():
            ex.fut.set_result(None)

    def abort(self, reason: str) -> None:
        """Fail the request in flight (if any) with `reason` and drop the connection."""
        self.abort_reason = reason
        self.open = False
        if self.transport is not None:
            self.transport.abort()


# Idle connections are dropped before a server's keep-alive timeout would close
# them (uvicorn: 5 s), so a request never goes out on a half-closed connection.
KEEPALIVE_S = 4.0


class Slot:
    """One in-flight request at a time over a reused connection. With `keep_text` its requests'
    outputs are `TextOutput`s that keep the answer's text (sessions)."""

    def __init__(self, target: Target, chat: bool, keep_text: bool = False) -> None:
        self.target = target
        self.chat = chat
        self.conn: Connection | None = None
        self.exchange: type[_Exchange] = _TextExchange if keep_text else _Exchange

    async def send(self, request: bytes, out: RequestOutput, timeout_s: float) -> RequestOutput:
        """Send one request and fill `out`; never raises except on cancellation."""
        loop = asyncio.get_running_loop()
        out.start_time = start = time.perf_counter()
        fut: asyncio.Future[None] = loop.create_future()
        timer = loop.call_at(loop.time() + timeout_s, self._timeout, fut, out, timeout_s)
        try:
            conn = self.conn
            if conn is None or not conn.open or start - conn.idle_since > KEEPALIVE_S:
                if conn is not None and conn.open:
                    conn.transport.close()  # type: ignore[union-attr]
                conn = self.conn = await self._connect(timeout_s)
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # Python 3.11's wait_for returns a connection that completed just as the
                    # task was cancelled and drops the cancellation: a stopped batch's request
                    # would go out and hang. Honour it here.
                    raise asyncio.CancelledError
                if fut.done():  # timed out while connecting
                    conn.abort(out.error)
                    return out
            ex = self.exchange(out, self.chat, fut, conn.framing)
            conn.exchange = ex
            conn.abort_reason = None
            conn.transport.write(request)  # type: ignore[union-attr]
            await fut
            conn.idle_since = time.perf_counter()
        except asyncio.CancelledError:
            if self.conn is not None:
                self.conn.abort(out.error or "cancelled")
            raise
        except asyncio.TimeoutError:  # connecting took the whole budget
            if not out.error:
                out.error = f"timeout: no complete response within request_timeout_s={timeout_s:g}"
        except OSError as e:
            out.error = f"{type(e).__name__}: Cannot connect to host {self.target.host}:{self.target.port}: {e}"
        finally:
            timer.cancel()
            out.end_time = time.perf_counter()
        return out

    async def _connect(self, timeout_s: float) -> Connection:
        loop = asyncio.get_running_loop()
        t = self.target
        _, conn = await asyncio.wait_for(
            loop.create_connection(Connection, t.host, t.port, ssl=t.ssl, server_hostname=t.host if t.ssl else None),
            timeout_s,
        )
        return conn

    def _timeout(self, fut: asyncio.Future[None], out: RequestOutput, timeout_s: float) -> None:
        if fut.done():
            return
        out.error = f"timeout: no complete response within request_timeout_s={timeout_s:g}"
        if self.conn is not None and self.conn.exchange is not None:
            self.conn.exchange = None
            self.conn.abort(out.error)
        fut.set_result(None)

    def abort(self, reason: str) -> None:
        """Fail whatever this slot has in flight and close its connection."""
        if self.conn is not None:
            ex = self.conn.exchange
            if ex is not None and not ex.fut.done():
                ex.out.error = reason
                self.conn.exchange = None
                ex.fut.set_result(None)
            self.conn.abort(reason)

    def close(self) -> None:
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.close()
        self.conn = None
