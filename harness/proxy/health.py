"""Backend health for the proxy: the /health poller (with Mooncake's bootstrap query) and
the proxy's own readiness answer.

Polling uses aiohttp's client, off the hot path; the legs use `upstream`. A backend that
fails a poll is out until one passes (`backends.Pool.record_health`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from harness.limits import local_cause
from harness.proxy.backends import Backend, Pool
from harness.proxy.config import ProxyConfig
from harness.proxy.errors import describe
from harness.proxy.flows import loads
from harness.proxy.registry import Registry

log = logging.getLogger(__name__)

# A bootstrap /query answer lists a few engine ids; anything larger is not one.
MAX_BOOTSTRAP_ANSWER = 1 << 20


async def read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    """The body of resp, or ValueError once it exceeds cap bytes."""
    if resp.content_length is not None:
        if resp.content_length > cap:
            raise ValueError(f"response of {resp.content_length} bytes exceeds {cap}")
        return await resp.read()
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        buf += chunk
        if len(buf) > cap:
            raise ValueError(f"response exceeds {cap} bytes")
    return bytes(buf)


class HealthPoller:
    """Polls every backend's /health each health_interval_s and expires stale registrations."""

    def __init__(
        self,
        cfg: ProxyConfig,
        pool: Pool,
        registry: Registry | None,
        session: Callable[[], aiohttp.ClientSession],
    ) -> None:
        self.cfg, self.pool, self.registry, self.session = cfg, pool, registry, session
        self.timeout = aiohttp.ClientTimeout(total=cfg.health_timeout_s)

    async def run(self) -> None:
        while True:
            try:
                await asyncio.gather(*(self.poll(b) for b in self.pool.all()))
                if self.registry is not None:
                    self.registry.expire(time.monotonic(), self.cfg.registration_ttl_s)
            except Exception as exc:  # keep polling whatever happens
                log.warning("health poll error: %s", describe(exc))
            await asyncio.sleep(self.cfg.health_interval_s)

    async def poll(self, b: Backend) -> None:
        try:
            async with self.session().get(b.url + "/health", timeout=self.timeout) as resp:
                ok, reason = resp.status == 200, f"HTTP {resp.status}"
                await resp.read()
            if ok and b.bootstrap_addr is not None:
                await self.query_bootstrap(b)
        except (asyncio.TimeoutError, aiohttp.ClientError, ValueError, OSError) as exc:
            if (mine := local_cause(exc)) is not None:
                # The proxy's own shortage (descriptors, memory): no evidence about the backend.
                log.warning("health poll of %s not sent: the proxy ran out of a resource: %s", b.label, mine)
                return
            ok, reason = False, describe(exc)
        self.pool.record_health(b, ok, reason)

    async def query_bootstrap(self, b: Backend) -> None:
        """Mooncake: the engine id of each DP rank, from the prefill's bootstrap server."""
        assert b.bootstrap_addr is not None  # only Mooncake prefills are queried
        async with self.session().get(b.bootstrap_addr + "/query", timeout=self.timeout) as resp:
            if resp.status != 200:
                raise ValueError(f"bootstrap /query returned HTTP {resp.status}")
            data = loads(await read_capped(resp, MAX_BOOTSTRAP_ANSWER))
        if not isinstance(data, dict) or not data:
            raise ValueError("bootstrap /query returned no engines")
        ids = {int(rank): str(entry["engine_id"]) for rank, entry in data.items()}
        if ids != b.engine_ids:
            log.info("%s engines per DP rank: %s", b.label, ids)
        b.engine_ids, b.dp_size = ids, max(1, len(ids))


def readiness(cfg: ProxyConfig, pool: Pool, registry: Registry | None) -> tuple[bool, dict[str, Any]]:
    """Whether the expected instances are all available, and the /health body that says so."""
    now = time.monotonic()
    n_p, n_d = pool.count_available("prefill", now), pool.count_available("decode", now)
    exp_p, exp_d = cfg.want_prefill, cfg.want_decode
    n_a, exp_a = pool.count_available("aggregated", now), cfg.want_aggregated
    ok = n_p >= exp_p and n_d >= exp_d and n_a >= exp_a
    ttl = cfg.registration_ttl_s
    counts: dict[str, int] = (
        {"aggregated_instances": n_a, "expected_aggregated": exp_a}
        if cfg.use.instances == "aggregated"
        else {"prefill_instances": n_p, "decode_instances": n_d, "expected_prefill": exp_p, "expected_decode": exp_d}
    )
    body: dict[str, Any] = {
        "status": "ok" if ok else "not_ready",
        **counts,
        "connector": cfg.connector,
        # Which process answered: with --workers, each has its own view until its polls pass.
        "pid": os.getpid(),
        "backends": [b.describe(now, ttl, b.out_since is None and pool.ready(b, now)) for b in pool.all()],
    }
    if registry is not None:
        body["transfer_mode"] = registry.mode
    return ok, body
