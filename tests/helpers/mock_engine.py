"""harness.mock_engine's app served in a background thread, for tests that need an engine's HTTP answers."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.error
import urllib.request
from typing import Any

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from harness.mock_engine import MockEngineConfig, build_app


class Engine:
    """build_app(config) served in a background thread on an ephemeral port."""

    def __init__(self, **fields: Any) -> None:
        self.config = MockEngineConfig(**fields)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Engine:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _start(self) -> None:
        self._runner = web.AppRunner(build_app(self.config), handler_cancellation=True)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get(self, path: str) -> tuple[int, bytes]:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return r.status, r.read()

    def metrics(self) -> dict[str, float]:
        """Each sample by name (and '/finished_reason' where it has one), as Prometheus parses it."""
        out = {}
        for family in text_string_to_metric_families(self.get("/metrics")[1].decode()):
            for sample in family.samples:
                reason = sample.labels.get("finished_reason")
                out[sample.name + (f"/{reason}" if reason else "")] = sample.value
        return out
