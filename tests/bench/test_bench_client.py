"""The streaming HTTP client's response parser on synthetic bytes: framing, SSE, [DONE], errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from harness.bench.client import RequestFailed, RequestOutput, Target, _Exchange

pytestmark = pytest.mark.timeout(30)


def _event(obj) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def _tok(text: str = " t") -> bytes:
    return _event({"object": "text_completion", "choices": [{"index": 0, "text": text}]})


USAGE = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}})
DONE = _event("[DONE]")


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def _response(body: bytes, status: str = "200 OK", chunked: bool = True, extra: str = "") -> bytes:
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/event-stream\r\n{framing}\r\n{extra}\r\n"
    return head.encode() + body


def _run(feeds: list[tuple[bytes, float]], chat: bool = False, closed: bool = False, max_tokens: int = 8):
    """Feed (bytes, time) pieces of a request for `max_tokens`; returns (output, exchange, completed)."""
    loop = asyncio.new_event_loop()
    try:
        out = RequestOutput(prompt_len=3, expected_output_len=max_tokens)
        out.start_time = 10.0
        ex = _Exchange(out, chat, loop.create_future())
        complete = False
        for data, now in feeds:
            complete = ex.feed(data, now)
            if complete or ex.failure:
                break
        if closed and not complete:
            reason = ex.closed()
            if reason:
                out.error = reason
            complete = not reason
        return out, ex, complete
    finally:
        loop.close()


def test_chunked_stream_timing_and_usage():
    body = _chunked(_tok(), _tok(), _tok(), USAGE, DONE)
    raw = _response(body)
    # Split so that the first event arrives at t=10.1, two at 10.3 (one read), the rest at 10.6.
    a = raw.index(b"data:") + len(_tok()) + 2
    b = raw.index(b"data:", a + 10) + 2 * len(_tok()) + 10
    out, ex, complete = _run([(raw[:a], 10.1), (raw[a:b], 10.3), (raw[b:], 10.6)])
    assert complete and out.success and not out.error
    assert out.ttft == pytest.approx(0.1)
    assert out.itl == pytest.approx([0.2, 0.0])  # two events in one read share a timestamp
    assert out.latency == pytest.approx(0.3)
    assert out.output_tokens == 7  # the usage chunk wins over the 3 counted events
    assert ex.keep_alive


@pytest.mark.parametrize("chunked", [True, False])
def test_byte_by_byte_equals_one_read(chunked):
    body = _tok(" a") + _tok(" b") + DONE
    raw = _response(_chunked(body) if chunked else body, chunked=chunked)
    whole, _, done_whole = _run([(raw, 11.0)])
    split, _, done_split = _run([(raw[i : i + 1], 11.0) for i in range(len(raw))])
    assert done_whole and done_split and whole.success and split.success
    assert (whole.output_tokens, whole.ttft, whole.itl) == (2, 1.0, [0.0])
    assert (split.output_tokens, split.ttft, split.itl) == (2, 1.0, [0.0])


def test_general_sse_forms_crlf_comments_and_multiline_data():
    body = (
        b": ping\r\n\r\n"
        b'event: message\r\ndata:{"choices":[{"text":"x"}]}\r\n\r\n'
        b'data: {"choices":\r\ndata: [{"text":"y"}]}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    out, _, complete = _run([(_response(_chunked(body)), 10.5)])
    assert complete and out.success and out.output_tokens == 2, out.error


def test_done_stops_parsing_and_no_done_fails():
    out, ex, _ = _run([(_response(_chunked(_tok(), DONE, b"data: not json\n\n")), 10.2)])
    assert out.success and ex.done and out.output_tokens == 1  # what follows [DONE] is ignored
    out, _, _ = _run([(_response(_chunked(_tok(), _tok())), 10.2)])
    assert not out.success and out.error == "stream ended without data: [DONE]"
    out, _, _ = _run([(_response(_chunked(USAGE, DONE)), 10.2)])
    assert not out.success and out.error == "stream had no content chunk"


def test_done_without_trailing_blank_line():
    out, _, complete = _run(
        [
            (
                _response(
                    b"data: " + json.dumps({"choices": [{"text": "a"}]}).encode() + b"\n\ndata: [DONE]\n", chunked=False
                ),
                10.2,
            )
        ]
    )
    assert complete and out.success and out.output_tokens == 1


def test_error_mid_stream_fails_at_once_with_its_message():
    err = _event({"error": {"message": "KV transfer failed", "code": 500}})
    out, ex, _ = _run([(_response(_chunked(_tok(), err, _tok(), DONE)), 10.2)])
    assert not out.success and out.error == ex.failure
    assert ex.failure == 'error in stream: {"message": "KV transfer failed", "code": 500}'
    obj_err = _event({"object": "error", "message": "bad", "code": 400})
    out, ex, _ = _run([(_response(_chunked(obj_err)), 10.2)])
    assert ex.failure == "error in stream: bad"
    # A generated text that merely contains the word "error" is no error.
    out, _, _ = _run([(_response(_chunked(_tok(" error"), DONE)), 10.2)])
    assert out.success


def test_invalid_json_and_non_object_events_fail():
    _, ex, _ = _run([(_response(_chunked(_tok(), b"data: {oops\n\n", DONE)), 10.2)])
    assert ex.failure == "invalid JSON in stream: b'{oops'"
    _, ex, _ = _run([(_response(_chunked(b"data: 42\n\n", DONE)), 10.2)])
    assert ex.failure == "unexpected event in stream: 42"


def test_http_error_status_keeps_the_body():
    body = json.dumps({"error": {"message": "The model `x` does not exist."}}).encode()
    out, _, complete = _run([(_response(body, "404 Not Found", chunked=False), 10.1)])
    assert complete and not out.success
    assert out.error.startswith('HTTP 404 Not Found: {"error"') and "does not exist" in out.error


def test_chat_role_chunk_is_not_a_token():
    role = _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    tok = _event({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    raw = _response(_chunked(role, tok, tok, DONE))
    out, _, _ = _run([(raw, 10.4)], chat=True)
    assert out.success and out.output_tokens == 2 and out.itl == [0.0]


def test_body_until_close_and_truncation():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    out, ex, complete = _run([(head + _tok() + DONE, 10.3)], closed=True)
    assert complete and out.success and not ex.keep_alive
    out, _, complete = _run([(_response(_chunked(_tok()))[:-20], 10.3)], closed=True)
    assert not complete and "closed the connection before the response ended" in out.error
    out, _, _ = _run([(b"", 10.3)], closed=True)
    assert "before responding" in out.error


def test_connection_close_header_and_interim_100():
    raw = b"HTTP/1.1 100 Continue\r\n\r\n" + _response(_chunked(_tok(), DONE), extra="Connection: close\r\n")
    out, ex, complete = _run([(raw, 10.2)])
    assert complete and out.success and not ex.keep_alive


def test_target_and_request_bytes():
    t = Target.from_url("http://127.0.0.1:8000/v1/completions")
    assert (t.host, t.port, t.path, t.ssl, t.host_header) == (
        "127.0.0.1",
        8000,
        "/v1/completions",
        None,
        "127.0.0.1:8000",
    )
    raw = t.request_bytes({"prompt": "é", "max_tokens": 2})
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n")
    assert f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body) == {"prompt": "é", "max_tokens": 2}
    s = Target.from_url("https://example.com/v1/chat/completions")
    assert (s.port, s.host_header) == (443, "example.com") and s.ssl is not None
    with pytest.raises(ValueError):
        Target.from_url("ftp://x/")


def _per_chunk(raw: bytes, t0: float = 10.0, step: float = 0.01) -> list[tuple[bytes, float]]:
    """The response as a streamed decode delivers it: the head, then one chunk per read."""
    head_end = raw.index(b"\r\n\r\n") + 4
    feeds, pos, t = [(raw[:head_end], t0)], head_end, t0
    while pos < len(raw):
        eol = raw.index(b"\r\n", pos)
        size = int(raw[pos:eol].split(b";")[0], 16)
        end = eol + 2 + size + 2 if size else len(raw)
        t += step
        feeds.append((raw[pos:end], t))
        pos = end
    return feeds


CHAT_ROLE = _event({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
CHAT_TOK = _event({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " x"}}]})


@pytest.mark.parametrize(
    ("events", "chat"),
    [
        ((_tok(), _tok(), _tok(), USAGE, DONE), False),
        ((_tok(), _event({"error": {"message": "KV transfer failed"}}), _tok(), DONE), False),
        ((_tok(), b"data: {oops\n\n", DONE), False),
        ((_tok(), b"data: 42\n\n", DONE), False),
        ((_tok(" error"), _tok(" usage"), DONE), False),
        ((_tok(), _tok() + _tok(), b": comment\n" + _tok(), _tok().replace(b"\n", b"\r\n"), DONE), False),
        ((CHAT_ROLE, CHAT_TOK, CHAT_TOK, DONE), True),
        ((_tok(),), False),
    ],
)
def test_one_event_per_read_parses_as_the_general_path(events, chat, monkeypatch):
    """A decode streams one event per read, which takes the parser's fast path; whatever the
    events hold, the outcome is the general path's (fed event by event through it)."""
    raw = _response(_chunked(*events))
    fast, fex, fdone = _run(_per_chunk(raw), chat=chat)
    # The same reads with the fast path turned off.
    monkeypatch.setattr(_Exchange, "_one_chunk", lambda self, data, now: False)
    slow, sex, sdone = _run(_per_chunk(raw), chat=chat)
    assert (fdone, fex.failure, fast.success, fast.error) == (sdone, sex.failure, slow.success, slow.error)
    assert (fast.output_tokens, fast.ttft, fast.itl, fex.chunks) == (
        slow.output_tokens,
        slow.ttft,
        slow.itl,
        sex.chunks,
    )


def test_one_event_per_read_takes_the_fast_path(monkeypatch):
    taken = []
    real = _Exchange._one_chunk

    def spy(self, data, now):
        taken.append(real(self, data, now))
        return taken[-1]

    monkeypatch.setattr(_Exchange, "_one_chunk", spy)
    out, _, done = _run(_per_chunk(_response(_chunked(_tok(), _tok(), _tok(), USAGE, DONE))))
    assert done and out.success and out.itl == pytest.approx([0.01, 0.01])
    assert taken[:3] == [True, True, True] and not any(taken[3:])  # usage and [DONE]: general path


# -- the server's usage, checked against what was streamed and asked for ------------


def _usage(tokens: object) -> bytes:
    return _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}})


@pytest.mark.parametrize(
    ("events", "usage", "error"),
    [
        (3, 3, None),  # vLLM's default: one token per event
        (2, 5, None),  # several tokens per event (speculative decoding, --stream-interval)
        (4, 3, None),  # a closing event that carries only the finish reason
        (8, 8, None),  # exactly max_tokens
        (3, 100_000, "usage.completion_tokens 100000 is more than the 8 asked for (max_tokens)"),
        (3, 9, "usage.completion_tokens 9 is more than the 8 asked for (max_tokens)"),
        (5, 3, "usage.completion_tokens 3 is fewer than the 5 content events streamed"),
        (1, 0, "usage.completion_tokens 0 is fewer than the 1 content events streamed"),
        (2, "2", "usage.completion_tokens is not an integer: '2'"),
    ],
)
def test_usage_is_checked_against_the_stream_and_max_tokens(events, usage, error):
    body = _chunked(*([_tok()] * events), _usage(usage), DONE)
    for feeds in ([(_response(body), 10.5)], _per_chunk(_response(body))):  # one read; one per event
        out, _, done = _run(feeds)
        assert done and out.success is (error is None) and out.error == (error or "")
        if error is None:
            assert out.output_tokens == usage


def test_without_a_known_max_tokens_only_the_stream_bounds_usage():
    # A load process's outputs carried max_tokens 0 (unknown) before it was passed to them.
    body = _chunked(_tok(), _tok(), _usage(50), DONE)
    out, _, _ = _run([(_response(body), 10.5)], max_tokens=0)
    assert out.success and out.output_tokens == 50


# -- framing (llhttp) -------------------------------------------------------------


def test_several_chunks_in_one_read_decode_in_one_batch(monkeypatch):
    blocks = []
    real = _Exchange._events

    def spy(self, block, now):
        blocks.append(block)
        real(self, block, now)

    monkeypatch.setattr(_Exchange, "_events", spy)
    raw = _response(_chunked(_tok(), _tok(), _tok(), DONE))
    out, _, complete = _run([(raw, 10.2)])
    assert complete and out.success and out.output_tokens == 3 and out.itl == [0.0, 0.0]
    assert len(blocks) == 1 and blocks[0].count(b"data: ") == 4  # one decode for the whole read


@pytest.mark.parametrize("piece", [1, 3, 7])
def test_chunk_extensions_and_size_lines_split_across_reads(piece):
    raw = _response(_chunked(_tok(" a"), _tok(" b"), DONE)).replace(b"\r\ndata", b';ext="v";x\r\ndata')
    assert raw.count(b';ext="v"') == 3  # precondition: every chunk carries extensions
    out, ex, complete = _run([(raw[i : i + piece], 10.0 + i / 1000) for i in range(0, len(raw), piece)])
    assert complete and out.success and out.output_tokens == 2 and ex.keep_alive, out.error


def test_content_length_body_split_mid_event_and_cut_short():
    body = _tok(" a") + _tok(" b") + DONE
    raw = _response(body, chunked=False)
    cut = raw.index(b"data:") + 10  # inside the first event
    out, _, complete = _run([(raw[:cut], 10.1), (raw[cut:], 10.3)])
    assert complete and out.success and out.output_tokens == 2
    assert out.ttft == pytest.approx(0.3)  # the event completes with the second read
    out, _, complete = _run([(raw[:-5], 10.1)], closed=True)
    assert not complete and out.error == "server closed the connection before the response ended"


def test_response_cut_mid_chunk_or_before_the_last_chunk():
    raw = _response(_chunked(_tok(), DONE))
    mid = raw.index(b"[DONE]")
    out, _, complete = _run([(raw[:mid], 10.1)], closed=True)
    assert not complete and out.error == "server closed the connection before the response ended"
    out, _, complete = _run([(raw[: -len(b"0\r\n\r\n")], 10.1)], closed=True)  # [DONE] seen, no last chunk
    assert not complete and out.error == "server closed the connection before the response ended"


def test_chunk_trailers_http10_and_reason_split_byte_by_byte():
    raw = _response(_chunked(_tok(), DONE))
    with_trailer = raw[:-2] + b"X-Trailer: 1\r\n\r\n"
    assert with_trailer.endswith(b"0\r\nX-Trailer: 1\r\n\r\n")
    out, ex, complete = _run([(with_trailer[:-8], 10.1), (with_trailer[-8:], 10.2)])
    assert complete and out.success and ex.keep_alive
    http10 = _response(_tok() + DONE, chunked=False).replace(b"HTTP/1.1", b"HTTP/1.0")
    out, ex, complete = _run([(http10, 10.1)])
    assert complete and out.success and not ex.keep_alive
    kept = _response(_tok() + DONE, chunked=False, extra="Connection: keep-alive\r\n").replace(b"HTTP/1.1", b"HTTP/1.0")
    out, ex, complete = _run([(kept, 10.1)])
    assert complete and out.success and ex.keep_alive
    err = _response(b'{"error": "nope"}', "503 Service Unavailable", chunked=False)
    out, _, complete = _run([(err[i : i + 1], 10.1) for i in range(len(err))])
    assert complete and out.error == 'HTTP 503 Service Unavailable: {"error": "nope"}'


def test_bytes_after_the_response_drop_keep_alive():
    ok = _response(_chunked(_tok(), DONE))
    out, ex, complete = _run([(ok, 10.1)])
    assert complete and out.success and ex.keep_alive  # precondition: the response alone keeps it
    for extra in (b"HTTP/1.1 200 OK\r\n", b"garbage"):
        out, ex, complete = _run([(ok + extra, 10.1)])
        assert complete and out.success and not ex.keep_alive, extra


@pytest.mark.parametrize(
    ("feeds", "names"),
    [
        ([b"SSH-2.0-OpenSSH_9.6\r\n"], ("HTTP/", "SSH-2.0")),
        ([_response(b""), b"zz\r\n"], ("chunk size", "zz")),
    ],
)
def test_malformed_framing_fails_naming_the_read(feeds, names):
    with pytest.raises(RequestFailed) as err:
        _run([(f, 10.1) for f in feeds])
    assert all(n in str(err.value) for n in names), str(err.value)


def test_a_cancel_that_lands_as_the_connection_opens_sends_nothing(monkeypatch):
    """A stop cancels the batch's tasks; when the cancel lands just as a new connection opens,
    Python 3.11's wait_for returns the connection and drops the cancel. The request must not go
    out (it would hang on a server that never answers, long after the stop)."""
    from harness import aio
    from harness.bench.client import Slot

    received: list[bytes] = []

    async def go() -> tuple[bool, float]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.append(await reader.read(1 << 16))  # never answers

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        slot = Slot(Target.from_url(f"http://127.0.0.1:{port}/v1/completions"), False)
        real = Slot._connect

        async def connect_then_swallow_a_cancel(self, timeout_s):
            conn = await real(self, timeout_s)
            me = asyncio.current_task()
            me.cancel()
            try:
                await asyncio.sleep(0)  # the cancel arrives here...
            except asyncio.CancelledError:
                pass  # ...and is dropped, as wait_for does when its connection is done
            assert me.cancelling() == 1  # precondition: the task is still being cancelled
            return conn

        monkeypatch.setattr(Slot, "_connect", connect_then_swallow_a_cancel)
        body = {"model": "m", "prompt": "x", "max_tokens": 2, "stream": True}
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        task = asyncio.create_task(slot.send(slot.target.request_bytes(body), RequestOutput(1, 2), 10.0))
        try:
            await asyncio.wait_for(asyncio.shield(task), 5)
            cancelled = False
        except asyncio.CancelledError:
            cancelled = True
        took = loop.time() - t0
        slot.close()  # the server's read ends: with the request's bytes if any were written
        deadline = loop.time() + 5
        while not received and loop.time() < deadline:
            await asyncio.sleep(0.01)
        server.close()
        await server.wait_closed()
        return cancelled, took

    cancelled, took = aio.run(go())
    assert cancelled and took < 2.0
    assert received == [b""]  # the connection opened and closed; no request was written on it
