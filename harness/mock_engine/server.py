"""The mock engine's process: its aiohttp application, arrival clock and event loop."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

from aiohttp import web

from harness import aio
from harness.mock_engine.app import MAX_REQUEST_BYTES, Engine
from harness.mock_engine.settings import MockEngineConfig

log = logging.getLogger(__name__)


ENGINE_KEY = web.AppKey("pdbench_mock_engine", Engine)


def build_app(config: MockEngineConfig) -> web.Application:
    """The mock engine's aiohttp application; run it with web.AppRunner or serve()."""
    engine = Engine(config)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[ENGINE_KEY] = engine
    app.router.add_post("/v1/completions", engine.handle_generate)
    app.router.add_post("/v1/chat/completions", engine.handle_generate)
    app.router.add_get("/v1/models", engine.handle_models)
    app.router.add_get("/health", engine.handle_health)
    app.router.add_get("/mock/emissions", engine.handle_emissions)
    app.router.add_get("/metrics", engine.handle_metrics)
    return app


class _ArrivalClock(asyncio.Protocol):
    """Wraps aiohttp's protocol to note when a request's first bytes arrive.

    aiohttp starts a handler two event-loop iterations after parsing the request (and
    later still while other handlers run); counting latencies from the arrival makes
    the injected TTFT what a client sees, whatever the engine is busy with.
    """

    def __init__(self, inner: asyncio.Protocol, arrivals: dict[Any, float]) -> None:
        self.inner, self.arrivals, self.transport = inner, arrivals, None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport not in self.arrivals:  # the handler takes it; the next request sets it again
            self.arrivals[self.transport] = time.perf_counter()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.arrivals.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


async def _serve(config: MockEngineConfig) -> None:
    app = build_app(config)
    engine = app[ENGINE_KEY]
    # handler_cancellation: a client that goes away stops its stream.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _ArrivalClock(runner.server(), engine.arrivals),  # type: ignore[misc]
        config.host,
        config.port,
        reuse_address=True,
    )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        server.close()
        await runner.cleanup()


def serve(config: MockEngineConfig) -> None:
    """Run the mock engine until SIGINT/SIGTERM (uvloop when importable)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info(
        "pdbench mock engine on %s:%d model=%s role=%s ttft_ms=%s itl_ms=%s",
        config.host,
        config.port,
        config.model,
        config.role,
        config.ttft_ms,
        config.itl_ms,
    )
    loop = aio.new_event_loop()
    try:
        loop.run_until_complete(_serve(config))
    finally:
        loop.close()
