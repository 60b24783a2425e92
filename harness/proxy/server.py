"""The proxy's process: the aiohttp application, its event loop, and N worker processes."""

from __future__ import annotations

import logging
import os
import signal
import socket
from typing import Any

from aiohttp import web

from harness import aio
from harness.proxy.app import Proxy
from harness.proxy.config import ProxyConfig

log = logging.getLogger(__name__)


PROXY_KEY = web.AppKey("pdbench_proxy", Proxy)


def build_app(config: ProxyConfig) -> web.Application:
    """The proxy's aiohttp application (session, poller and registration live with it)."""
    proxy = Proxy(config)
    # The body limit is checked in the handler (JSON 413); aiohttp's own is a backstop.
    app = web.Application(client_max_size=config.max_body_bytes)
    app[PROXY_KEY] = proxy
    app.cleanup_ctx.append(proxy.lifespan)
    app.router.add_post("/v1/completions", proxy.handle_generate)
    app.router.add_post("/v1/chat/completions", proxy.handle_generate)
    app.router.add_get("/health", proxy.handle_health)
    app.router.add_get("/metrics", proxy.handle_metrics)
    app.router.add_get("/v1/models", proxy.handle_models)
    return app


def _run(config: ProxyConfig, sock: socket.socket | None) -> None:
    kwargs: dict[str, Any] = {"sock": sock} if sock is not None else {"host": config.host, "port": config.port}
    web.run_app(
        build_app(config),
        loop=aio.new_event_loop(),
        # Cancel the handler (and so the upstream legs) when the client disconnects.
        handler_cancellation=True,
        access_log=None,  # one line per request would cost more than the proxying
        print=None,
        **kwargs,
    )


def serve(config: ProxyConfig) -> None:
    """Run the proxy until SIGINT/SIGTERM (with `workers` > 1, that many processes on one port)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    # SO_REUSEPORT: the kernel spreads connections over the processes; each has its
    # own session, poller and metrics (so /metrics shows one worker's share).
    children = []
    for _ in range(config.workers):
        pid = os.fork()
        if pid == 0:
            sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((config.host, config.port))
            try:
                _run(config, sock)
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
