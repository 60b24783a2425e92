"""The mock engine's behaviour: prompt counting, token timing, streaming, vLLM's /metrics.

See the package docstring (`harness.mock_engine`) for the public API and behaviour.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
import uuid
from typing import Any

from aiohttp import web

from harness.mock_engine.counters import EngineCounters
from harness.mock_engine.exposition import EngineMetrics
from harness.mock_engine.settings import MockEngineConfig

try:  # optional: faster request parsing
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads  # type: ignore[assignment]  # same contract as orjson.loads

log = logging.getLogger(__name__)


# The generated text cycles through these words; each is one token for the
# whitespace counter (a leading space, no other whitespace) and needs no JSON escaping.
WORDS = (" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", " again")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DONE = b"data: [DONE]\n\n"
MAX_REQUEST_BYTES = 256 * 1024 * 1024


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, etype: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.etype = status, etype


def _error(status: int, message: str, etype: str) -> web.Response:
    # vLLM's ErrorResponse shape.
    body = {"error": {"message": message, "type": etype, "param": None, "code": status}}
    return web.json_response(body, status=status)


class Engine:
    def __init__(self, cfg: MockEngineConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.ttft, self.itl = cfg.ttft, cfg.itl
        self.instant = self.ttft.is_zero and self.itl.is_zero
        self.counters = EngineCounters()
        self.slots = asyncio.Semaphore(cfg.max_num_seqs) if cfg.max_num_seqs else None
        self.metrics = EngineMetrics(self.counters, cfg.model)
        self.arrivals: dict[Any, float] = {}  # transport -> when its request began to arrive
        self.ids = itertools.count()
        self.id_prefix = uuid.uuid4().hex[:16]
        self.blocks = itertools.count()
        self.created = int(time.time())
        self.model_json = json.dumps(cfg.model)
        # Each token event is a per-request head (id, object, model) + a per-word suffix.
        self.suffix: dict[tuple[bool, str], list[bytes]] = {}
        for chat in (False, True):
            mid = '"delta":{"content":"' if chat else '"text":"'
            end = '"},"logprobs":null,"finish_reason":' if chat else '","logprobs":null,"finish_reason":'
            for reason in ("null", '"length"', '"stop"'):
                self.suffix[(chat, reason)] = [
                    f'{mid}{w}{end}{reason},"stop_reason":null}}]}}\n\n'.encode() for w in WORDS
                ]
        # Timer lateness of this event loop, learnt online (see _sleep_until).
        self.bias = 0.0
        # How late each write left, against its due time (s): the engine's own error, so a
        # benchmark of a client can take it out (GET /mock/emissions). Bounded memory.
        self.late_first: list[float] = []
        self.late_rest: list[float] = []
        # Each finished stream that carried a request id (ID_HEADERS): (id, arrival, first write,
        # last write, tokens), perf_counter seconds; a client benchmark matches them to its own
        # per-request times. Bounded memory.
        self.streams: list[tuple[str, float, float, float, int]] = []
        self.tokenizer: Any = None
        if cfg.tokenizer:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)

    # -- token counting ---------------------------------------------------

    def count_prompt(self, body: dict[str, Any], chat: bool) -> int:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _BadRequest("'messages' must be a non-empty list")
            if self.tokenizer is not None:
                try:
                    ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
                    # A BatchEncoding (a mapping, not a dict) in recent transformers, else a list of ids.
                    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)
                except Exception:
                    pass
            total = 0
            for m in messages:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list):  # [{"type": "text", "text": ...}]
                    content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                total += self._count_text(content if isinstance(content, str) else "")
            return max(1, total)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return max(1, self._count_text(prompt))
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)  # token ids
        raise _BadRequest("'prompt' must be a string, a list of token ids, or a list of one of those")

    def _count_text(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer(text).input_ids)
        return len(text.split())

    # -- timing -----------------------------------------------------------

    async def _sleep_until(self, deadline: float) -> None:
        """Sleep until `deadline` (perf_counter seconds), corrected for the loop's timer bias."""
        delay = deadline - time.perf_counter() - self.bias
        if delay <= 0:
            return
        await asyncio.sleep(delay)
        self.learn(time.perf_counter() - deadline)

    def learn(self, late: float) -> None:
        """Track how late timers fire (uvloop rounds to whole ms, asyncio's loop rounds up).

        A clipped step makes the bias converge to the median lateness, so one slow
        wake-up (a busy CPU) barely moves it; timers are then set that much early.
        """
        self.bias = min(2e-3, max(-2e-3, self.bias + 0.02 * min(5e-4, max(-5e-4, late))))

    # -- requests -----------------------------------------------------------

    def plan(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        """Validate a generation request; decide token counts and the KV-transfer leg."""
        model = body.get("model")
        if model is not None and model != self.cfg.model:
            raise _BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        prompt_tokens = self.count_prompt(body, chat)
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = self.cfg.default_max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _BadRequest(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if self.cfg.max_model_len is not None and prompt_tokens + max_tokens > self.cfg.max_model_len:
            raise _BadRequest(
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens} in the completion)."
            )
        ignore_eos = bool(body.get("ignore_eos", False))
        n = max_tokens
        finish = "length"
        if not ignore_eos and self.cfg.eos_after is not None and self.cfg.eos_after < max_tokens:
            n, finish = self.cfg.eos_after, "stop"

        kv = body.get("kv_transfer_params")
        if kv is not None and not isinstance(kv, dict):
            raise _BadRequest("kv_transfer_params must be an object")
        kv = kv or {}
        remote_decode = bool(kv.get("do_remote_decode"))
        remote_prefill = bool(kv.get("do_remote_prefill"))
        # Stricter than vLLM, which serves any request on a kv_both instance: a
        # misrouted leg is exactly what a proxy test wants to see.
        if self.cfg.role == "prefill" and remote_prefill:
            raise _BadRequest("this mock engine is a prefill instance; it got a decode leg (do_remote_prefill)")
        if self.cfg.role == "decode" and remote_decode:
            raise _BadRequest("this mock engine is a decode instance; it got a prefill leg (do_remote_decode)")
        external_hits = 0
        if remote_prefill:
            missing = [
                k for k in ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port") if kv.get(k) is None
            ]
            if missing:
                # vLLM's NIXL connector logs and recomputes the prompt locally.
                log.warning("do_remote_prefill without %s: recomputing the prompt", ", ".join(missing))
                remote_prefill = False
            else:
                external_hits = prompt_tokens
        stream = bool(body.get("stream", False))
        usage = stream and bool((body.get("stream_options") or {}).get("include_usage"))
        return dict(
            prompt_tokens=prompt_tokens,
            n=n,
            finish=finish,
            remote_decode=remote_decode,
            remote_prefill=remote_prefill,
            external_hits=external_hits,
            stream=stream,
            usage=usage,
        )

    def deadlines(self, t0: float, n: int, remote_prefill: bool) -> list[float]:
        """Absolute send time of each token: errors never accumulate over a stream."""
        rng = self.rng
        # The prompt's KV arrived from the prefill instance: no prefill here, the
        # first token costs one decode step.
        first = self.itl.sample_s(rng) if remote_prefill else self.ttft.sample_s(rng)
        out = [t0 + first]
        if self.itl.kind == "constant":
            gap = self.itl.a / 1000.0
            out.extend(out[0] + gap * k for k in range(1, n))
        else:
            t = out[0]
            for _ in range(n - 1):
                t += self.itl.sample_s(rng)
                out.append(t)
        return out

    def kv_params_out(self, rid: str, prompt_tokens: int) -> dict[str, Any]:
        """What vLLM's NIXL connector returns from a prefill leg (request_finished)."""
        nblocks = -(-prompt_tokens // self.cfg.block_size)
        first = next(self.blocks)
        for _ in range(nblocks - 1):
            next(self.blocks)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(range(first, first + nblocks))],
            "remote_engine_id": self.cfg.engine_id,
            "remote_request_id": rid,
            "remote_host": self.cfg.advertised_kv_host,
            "remote_port": self.cfg.kv_port,
            "tp_size": 1,
            "remote_num_tokens": prompt_tokens,
        }

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        # Latencies count from the request's arrival (noted by serve()'s protocol), else from now.
        t0 = self.arrivals.pop(request.transport, None) or time.perf_counter()
        chat = request.path.endswith("/chat/completions")
        try:
            body = _loads(await request.read())
            if not isinstance(body, dict):
                raise _BadRequest("request body must be a JSON object")
            p = self.plan(body, chat)
        except ValueError as e:
            return _error(400, f"malformed JSON body: {e}", "BadRequestError")
        except _BadRequest as e:
            return _error(e.status, str(e), e.etype)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.id_prefix}{next(self.ids):08x}"
        self.counters.admitted(p["prompt_tokens"], p["external_hits"])
        finished = held = False
        try:
            if self.slots is not None:
                await self.slots.acquire()
                held = True
                t0 = time.perf_counter()  # served from admission, as a scheduler's queue does
            if p["stream"]:
                resp = await self._stream(request, rid, chat, p, t0)
            else:
                resp = await self._complete(rid, chat, p, t0)
            finished = True
            return resp
        finally:
            if held:
                self.slots.release()  # type: ignore[union-attr]  # held only with slots
            if finished:
                self.counters.finished(p["n"], p["finish"])
            else:
                self.counters.aborted()

    def _usage(self, p: dict[str, Any]) -> dict[str, int]:
        return {
            "prompt_tokens": p["prompt_tokens"],
            "total_tokens": p["prompt_tokens"] + p["n"],
            "completion_tokens": p["n"],
        }

    async def _complete(self, rid: str, chat: bool, p: dict[str, Any], t0: float) -> web.Response:
        n = p["n"]
        if not self.instant:
            await self._sleep_until(self.deadlines(t0, n, p["remote_prefill"])[-1])
        text = "".join(WORDS[i % len(WORDS)] for i in range(n))
        kv = self.kv_params_out(rid, p["prompt_tokens"]) if p["remote_decode"] else None
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": p["finish"],
                "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": p["finish"], "stop_reason": None}
            obj = "text_completion"
        body = {
            "id": rid,
            "object": obj,
            "created": self.created,
            "model": self.cfg.model,
            "choices": [choice],
            "usage": self._usage(p),
            "kv_transfer_params": kv,
        }
        return web.json_response(body)

    def _chunks(self, rid: str, chat: bool, p: dict[str, Any]) -> tuple[list[bytes], bytes, bytes]:
        """Pre-encoded SSE events: one per word, the last token's (with the finish reason), the tail."""
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{self.created},'
            f'"model":{self.model_json},"choices":[{{"index":0,'
        ).encode()
        tokens = [head + sfx for sfx in self.suffix[(chat, "null")]]
        k = (p["n"] - 1) % len(WORDS)
        last = head + self.suffix[(chat, f'"{p["finish"]}"')][k]
        tail = b""
        if p["usage"]:
            usage = json.dumps(self._usage(p), separators=(",", ":"))
            tail = (
                f'data: {{"id":"{rid}","object":"{obj}","created":{self.created},'
                f'"model":{self.model_json},"choices":[],"usage":{usage}}}\n\n'
            ).encode()
        return tokens, last, tail + DONE

    @staticmethod
    def _events(tokens: list[bytes], last: bytes, n: int, i: int, j: int) -> bytes:
        """Token events i..j-1 of n, joined."""
        k = len(tokens)
        if j < n:
            return tokens[i % k] if j == i + 1 else b"".join([tokens[x % k] for x in range(i, j)])
        return b"".join([*(tokens[x % k] for x in range(i, n - 1)), last])

    async def _stream(
        self, request: web.Request, rid: str, chat: bool, p: dict[str, Any], t0: float
    ) -> web.StreamResponse:
        n = p["n"]
        tokens, last, tail = self._chunks(rid, chat, p)
        role = b""
        if chat:
            role = (
                f'data: {{"id":"{rid}","object":"chat.completion.chunk","created":{self.created},'
                f'"model":{self.model_json},"choices":[{{"index":0,"delta":{{"role":"assistant",'
                f'"content":""}},"logprobs":null,"finish_reason":null}}]}}\n\n'
            ).encode()
        if self.instant:
            # Every token is due at once: one write, no chunked framing.
            return web.Response(body=role + self._events(tokens, last, n, 0, n) + tail, headers=SSE_HEADERS)
        headers = request.headers
        stream_id = next((v for h in ID_HEADERS if (v := headers.get(h))), None)
        deadlines = self.deadlines(t0, n, p["remote_prefill"])
        resp = web.StreamResponse(headers=SSE_HEADERS)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"")  # sends the headers now if aiohttp held them back
        # Tokens are written from timer callbacks straight to the transport, framed as
        # the HTTP chunks aiohttp would send: no task switch per token, and every token
        # (the first too) goes through the same timer path, so one bias fits them all.
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stream = _Stream(self, request.transport, deadlines, tokens, last, n, 0, tail, done, role)  # type: ignore[arg-type]
        stream.record_id, stream.arrival = stream_id, t0
        stream.schedule()
        try:
            await done
        finally:
            stream.cancel()
        await resp.write_eof()
        return resp

    @staticmethod
    def _due(deadlines: list[float], j: int) -> int:
        """Index after the tokens already due (deadline passed) from j on."""
        now = time.perf_counter()
        n = len(deadlines)
        while j < n and deadlines[j] <= now:
            j += 1
        return j

    # -- other endpoints ------------------------------------------------------

    async def handle_models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.cfg.model,
            "object": "model",
            "created": self.created,
            "owned_by": "pdbench",
            "root": self.cfg.model,
            "parent": None,
            "max_model_len": self.cfg.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def handle_emissions(self, request: web.Request) -> web.Response:
        """Lateness of the writes since the last reset (ms): of each stream's first token (its
        TTFT's error at the server) and of the later ones; ?reset=1 starts a new count.
        ?requests=1 adds each finished stream that carried a request id (X-Request-Id, else
        X-Pdbench-Id): {id, arrival_s (this process's perf_counter), first_ms and last_ms (its
        first and last token's write, from the arrival), tokens}."""

        def stats(xs: list[float]) -> dict[str, float | int]:
            if not xs:
                return {"count": 0}
            ys = sorted(xs)
            pick = lambda q: ys[min(len(ys) - 1, int(q / 100 * len(ys)))] * 1000.0  # noqa: E731
            return {"count": len(ys), "median": pick(50), "p99": pick(99), "max": ys[-1] * 1000.0}

        body: dict[str, Any] = {
            "first_token_late_ms": stats(self.late_first),
            "later_tokens_late_ms": stats(self.late_rest),
        }
        if request.query.get("requests"):
            body["requests"] = [
                {
                    "id": rid,
                    "arrival_s": t0,
                    "first_ms": (first - t0) * 1000.0,
                    "last_ms": (last - t0) * 1000.0,
                    "tokens": n,
                }
                for rid, t0, first, last, n in self.streams
            ]
        if request.query.get("reset"):
            self.late_first, self.late_rest, self.streams = [], [], []
        return web.json_response(body)

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})


MAX_EMISSIONS = 2_000_000  # lateness samples kept between resets (16 MB)
MAX_STREAMS = 1_000_000  # per-request records kept between resets
# A stream's id for its record (GET /mock/emissions?requests=1): vLLM's `vllm bench serve` sends
# X-Request-Id, `pdbench bench` X-Pdbench-Id (with its proxy timings on).
ID_HEADERS = ("X-Request-Id", "X-Pdbench-Id")


class _Stream:
    """The tokens of one stream after the first write, sent from loop timer callbacks."""

    __slots__ = (
        "arrival",
        "deadlines",
        "done",
        "engine",
        "first_write",
        "handle",
        "head",
        "i",
        "last",
        "loop",
        "n",
        "record_id",
        "tail",
        "tokens",
        "transport",
    )

    def __init__(
        self,
        engine: Engine,
        transport: asyncio.Transport,
        deadlines: list[float],
        tokens: list[bytes],
        last: bytes,
        n: int,
        i: int,
        tail: bytes,
        done: asyncio.Future[None],
        head: bytes = b"",
    ) -> None:
        self.engine, self.transport, self.deadlines = engine, transport, deadlines
        self.tokens, self.last, self.n, self.i, self.tail, self.done = tokens, last, n, i, tail, done
        self.head = head  # sent before the first token (chat's role chunk)
        self.handle: asyncio.Handle | None = None
        # A stream with a request id is recorded when it ends (Engine.streams).
        self.record_id: str | None = None
        self.arrival = self.first_write = 0.0

    def schedule(self) -> None:
        self.loop = asyncio.get_running_loop()
        delay = self.deadlines[self.i] - time.perf_counter() - self.engine.bias
        self.handle = self.loop.call_later(max(0.0, delay), self.tick)

    def tick(self) -> None:
        if self.done.done():
            return
        i, n, deadlines, engine = self.i, self.n, self.deadlines, self.engine
        now = time.perf_counter()
        engine.learn(now - deadlines[i])
        record = engine.late_first if i == 0 else engine.late_rest
        if len(record) < MAX_EMISSIONS:
            record.append(now - deadlines[i])
        j = i + 1
        while j < n and deadlines[j] <= now:  # every token already due goes in this write
            j += 1
        data = (
            self.tokens[i % len(self.tokens)]
            if j == i + 1 and j < n
            else engine._events(self.tokens, self.last, n, i, j)
        )
        if self.head:
            data, self.head = self.head + data, b""
        if j == n:
            data += self.tail
        transport = self.transport
        if transport is None or transport.is_closing():
            self.done.set_exception(ConnectionResetError("client went away"))
            return
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        if i == 0:
            self.first_write = now
        if j == n and self.record_id is not None and len(engine.streams) < MAX_STREAMS:
            engine.streams.append((self.record_id, self.arrival, self.first_write, now, n))
        if j == n:
            self.done.set_result(None)  # the handler ends the body
            return
        self.i = j
        self.handle = self.loop.call_later(max(0.0, deadlines[j] - time.perf_counter() - engine.bias), self.tick)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
