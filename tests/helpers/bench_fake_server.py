"""A fake OpenAI-compatible streaming server for the bench client tests.

Runs aiohttp in a background thread on 127.0.0.1 (ephemeral port). Each request
streams `max_tokens` one-token chunks, a usage chunk and `data: [DONE]`, unless
`policy(n, body)` (n = 0-based arrival number) picks a failure mode:
"500" (HTTP error), "404" (vLLM's answer to an unknown model), "midstream" (error chunk after 2
tokens), "usage_high" / "usage_low" (usage.completion_tokens 100,000 / 1, whatever was streamed),
"hang" (stalls after 1 token until the server stops), "no_done" (stream ends without [DONE]),
"error_then_more" (an error event after 1 token, then tokens go on without [DONE]
until the server stops), "diverge" (token 3 differs from every other answer's). Chunks carry
`token_ids` when the body asks for them (`return_token_ids`, as vLLM). GET /health answers `health` (an HTTP status, settable at
any time; None: no such route, 404). `arrived[n]` and `ended[n]` are when request n's body
was read and when its handler finished (time.perf_counter, the load generator's clock), for
tests of when the load arrived.

Why not the mock engine (harness.mock_engine, the one stand-in for vLLM elsewhere): these
tests need a failure chosen per request by a Python callable, in the test's own process
(hang after one token, an error event followed by more tokens, a stream without [DONE],
health flipped mid-sweep), and the bodies the client sent; the mock engine models a
healthy vLLM's timing and metrics and has none of that.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

Policy = Callable[[int, dict[str, Any]], str | None]


class FakeServer:
    def __init__(self, policy: Policy | None = None, token_delay: float = 0.002) -> None:
        self.policy = policy
        self.token_delay = token_delay
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's headers, in arrival order as bodies
        self.arrived: list[float] = []
        self.ended: dict[int, float] = {}
        self.health: int | None = 200
        self.health_checks = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    async def _stop(self) -> None:
        self._stopping.set()  # releases "hang" handlers
        await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.Response(status=404 if self.health is None else self.health)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = len(self.bodies)
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        self.arrived.append(time.perf_counter())
        try:
            return await self._answer(request, n, body)
        finally:
            self.ended[n] = time.perf_counter()

    async def _answer(self, request: web.Request, n: int, body: dict[str, Any]) -> web.StreamResponse:
        mode = self.policy(n, body) if self.policy else None
        if mode == "500":
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        if mode == "404":  # vLLM's answer to a model it does not serve
            message = f"The model `{body.get('model')}` does not exist."
            return web.json_response({"error": {"message": message, "type": "NotFoundError", "code": 404}}, status=404)
        chat = request.path.endswith("/chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj: Any) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            await resp.write(f"data: {data}\n\n".encode())

        if chat:
            await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i in range(body["max_tokens"]):
            await asyncio.sleep(self.token_delay)
            if mode == "midstream" and i == 2:
                await send({"error": {"message": "injected mid-stream failure", "code": 500}})
                await send("[DONE]")
                return resp
            if mode == "error_then_more" and i == 1:
                await send({"error": {"message": "injected error, stream goes on", "code": 500}})
                while not self._stopping.is_set():
                    await send({"object": "text_completion", "choices": [{"index": 0, "text": " x"}]})
                    await asyncio.sleep(0.05)
                return resp
            if mode == "hang" and i == 1:
                await asyncio.wait_for(self._stopping.wait(), timeout=30)
                return resp
            token = 1000 + i if mode == "diverge" and i == 3 else i
            text = f" t{token}"
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            if body.get("return_token_ids"):
                choice["token_ids"] = [token]
            await send({"object": "text_completion", "choices": [choice]})
        usage = {"usage_high": 100_000, "usage_low": 1}.get(mode or "", body["max_tokens"])
        await send({"choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": usage}})
        if mode != "no_done":
            await send("[DONE]")
        return resp
