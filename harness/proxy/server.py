"""The proxy's process: its HTTP server and routes, its event loop, and N worker processes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from harness import aio
from harness.limits import raise_open_files
from harness.proxy.app import Proxy
from harness.proxy.config import ProxyConfig
from harness.proxy.http import KEEPALIVE_S, Handler, HttpServer
from harness.proxy.shared import SharedState

log = logging.getLogger(__name__)

# In-flight requests get this long to end after a stop signal before they are cut.
SHUTDOWN_GRACE_S = 5.0
BACKLOG = 4096  # bursts of thousands of connections at high concurrency


def routes(proxy: Proxy) -> dict[tuple[str, str], Handler]:
    return {
        ("POST", "/v1/completions"): proxy.handle_generate,
        ("POST", "/v1/chat/completions"): proxy.handle_generate,
        ("GET", "/health"): proxy.handle_health,
        ("GET", "/metrics"): proxy.handle_metrics,
        ("GET", "/v1/models"): proxy.handle_models,
    }


@dataclass
class Serving:
    """A proxy accepting connections (its state and the port it listens on)."""

    proxy: Proxy
    port: int


@asynccontextmanager
async def serving(
    config: ProxyConfig,
    sock: socket.socket | None = None,
    keepalive_s: float = KEEPALIVE_S,
    shared: SharedState | None = None,
) -> AsyncIterator[Serving]:
    """Run the proxy on `sock`, else on config.host:config.port (port 0: any free port);
    `shared`: the state of all worker processes, this one's row selected."""
    proxy = Proxy(config, shared)
    http = HttpServer(routes(proxy), config.max_body_bytes, keepalive_s)
    loop = asyncio.get_running_loop()
    async with proxy.running():
        if sock is not None:
            server = await loop.create_server(http.protocol, sock=sock, backlog=BACKLOG)
        else:
            server = await loop.create_server(http.protocol, config.host, config.port, backlog=BACKLOG)
        sweeper = asyncio.ensure_future(http.sweep())
        try:
            yield Serving(proxy, server.sockets[0].getsockname()[1])
        finally:
            sweeper.cancel()
            server.close()
            tasks = [c.task for c in http.connections if c.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
            http.close_all()
            await asyncio.gather(*tasks, return_exceptions=True)


def _run(config: ProxyConfig, sock: socket.socket | None, shared: SharedState | None = None) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with serving(config, sock, shared=shared):
            await stop.wait()

    aio.run(main())


def serve(config: ProxyConfig) -> None:
    """Run the proxy until SIGINT/SIGTERM (with `workers` > 1, that many processes on one port)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    soft, hard = raise_open_files()  # before the workers fork: they inherit it
    log.info("open-file limit %d (hard %d)", soft, hard)
    log.info(
        "pdbench proxy on %s:%d connector=%s policy=%s prefill=%s decode=%s expected=%dP/%dD workers=%d",
        config.host,
        config.port,
        config.connector,
        config.policy,
        config.prefill,
        config.decode,
        config.want_prefill,
        config.want_decode,
        config.workers,
    )
    if config.workers == 1:
        _run(config, None)
        return
    # SO_REUSEPORT: the kernel spreads connections over the processes. Legs in flight
    # and open circuits are shared (harness.proxy.shared); each has its own session,
    # poller and request metrics (so /metrics counts one worker's requests).
    shared = SharedState(config.workers, len(config.prefill) + len(config.decode) + len(config.aggregated))
    children = []
    for worker in range(config.workers):
        pid = os.fork()
        if pid == 0:
            sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((config.host, config.port))
            try:
                _run(config, sock, shared.as_worker(worker))
            finally:
                os._exit(0)
        children.append(pid)

    def forward(signum: int, frame: Any) -> None:
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    for pid in children:
        while True:
            try:
                _, code = os.waitpid(pid, 0)
                status = status or os.waitstatus_to_exitcode(code)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                break
    if status:
        raise SystemExit(status)
