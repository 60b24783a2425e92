"""The bench fake server with vLLM's profiler endpoints, and a profiled sweep against it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from aiohttp import web

from harness.bench import ClientConfig, run_sweep
from helpers.bench_fake_server import FakeServer


class ProfiledFake(FakeServer):
    """The bench tests' fake server (tests/helpers/bench_fake_server.py) with vLLM's profiler endpoints:
    each call's perf_counter time recorded; on stop a trace file written into `capture`."""

    def __init__(self, capture: Path, mounted: bool = True) -> None:
        super().__init__(token_delay=0.002)
        self.capture, self.mounted = capture, mounted
        self.profile_calls: list[tuple[str, float, dict]] = []

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", self._handle)
        if self.mounted:
            app.router.add_post("/start_profile", self._start_profile)
            app.router.add_post("/stop_profile", self._stop_profile)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    async def _start_profile(self, request: web.Request) -> web.Response:
        self.profile_calls.append(("start", time.perf_counter(), await request.json()))
        return web.Response(status=200)

    async def _stop_profile(self, request: web.Request) -> web.Response:
        self.profile_calls.append(("stop", time.perf_counter(), {}))
        prefix = next(b for c, _, b in reversed(self.profile_calls) if c == "start")["profile_prefix"]
        self.capture.mkdir(parents=True, exist_ok=True)
        (self.capture / f"{prefix}_rank0.1.pt.trace.json.gz").write_bytes(b"{}")
        return web.Response(status=200)


PROFILE_PROMPTS = 6  # measured requests per point


def profiled_sweep(model_dir: str, out: Path, srv: ProfiledFake, **profile: object) -> dict[int, dict]:
    cfg = ClientConfig(
        base_url=srv.base_url,
        model="tiny",
        tokenizer=model_dir,
        isl=16,
        osl=4,
        concurrency=[1, 2],
        num_prompts=PROFILE_PROMPTS,
        num_warmups=1,
        result_dir=str(out),
        health_check_interval_s=0,
        sentinels={"enabled": False},
        scrape=[f"decode-0=decode@{srv.base_url}"],  # no /metrics: the points are not checked
        profile={"points": [2], "roles": ["decode"], "stop_timeout_s": 10, **profile},
    )
    return {json.loads(p.read_text())["max_concurrency"]: json.loads(p.read_text()) for p in run_sweep(cfg)}
