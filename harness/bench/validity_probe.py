"""Scrape every server's /metrics around one benchmark point and judge the point's validity.

The scrapes are kept under <result_dir>/metrics/concurrency_<C>/ (before and after); the
gauge samples taken during the point are folded into running peaks as they arrive, so memory
stays bounded however long the point runs. The verdict goes into the result's metadata as
`valid` and `validity` (see harness.validity); what each server's prefix cache found, per role
and per instance, is `prefix_cache` after finish() (the result's section of that name).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from harness import kv_connectors
from harness.kv_connectors.entry import KvEvidence
from harness.rundir.kv_ceiling import KvCeiling
from harness.rundir.paths import log_name
from harness.rundir.prefix_cache_summary import PrefixCacheSummary
from harness.validity import (
    ClientCounts,
    PointValidity,
    ServerScrapes,
    ValidityThresholds,
    early_reason,
    evaluate,
    gauge_peaks,
    kv_transport,
    receives_behind,
    scrape,
    stopped_early,
)
from harness.validity import prefix_cache as cache
from harness.validity.ucx_lanes import lane_from_logs

SAMPLE_INTERVAL_S = 2.0
RECEIVES_SETTLE_S = 5.0  # the most a point's end waits for its last completed KV transfers to be counted


def parse_target(text: str) -> tuple[str, str, str]:
    """'decode-0=decode@http://10.0.0.2:8200' -> (name, role, base URL)."""
    name, sep, rest = text.partition("=")
    role, sep2, url = rest.partition("@")
    if not (sep and sep2 and name and url) or role not in ("prefill", "decode", "aggregated", "proxy"):
        raise ValueError(f"expected NAME=ROLE@URL with ROLE prefill, decode or proxy, got {text!r}")
    return name, role, url.rstrip("/")


def _get(url: str, timeout: float) -> str:
    # Sampled every few seconds: a failed scrape ("") is not logged; it leaves the rules
    # that need it "not checked", which the point's verdict says.
    try:
        return scrape.fetch_metrics(url, timeout)
    except scrape.SCRAPE_ERRORS:
        return ""


class PointProbe:
    """`completed()` counts the point's requests that succeeded so far; `on_invalid(reason)` is
    called once, from thresholds.early_check_s into the point on, when a sample already shows
    the point invalid (harness.validity.early_reason): the caller stops the point."""

    def __init__(
        self,
        targets: list[str],
        out_dir: Path,
        thresholds: ValidityThresholds,
        connector: str | None = None,
        completed: Callable[[], int] = lambda: 0,
        on_invalid: Callable[[str], None] = lambda reason: None,
        kv_ceiling: KvCeiling | None = None,
        logs_dir: Path | None = None,
    ):
        self.targets = [parse_target(t) for t in targets]
        self.out_dir, self.thresholds, self.connector = out_dir, thresholds, connector
        self.completed, self.on_invalid = completed, on_invalid
        self.kv_ceiling, self.logs_dir = kv_ceiling, logs_dir
        self.before: dict[str, str] = {}
        self.peaks: dict[str, dict[str, float]] = {name: {} for name, _, _ in self.targets}
        self.early: tuple[str, float] | None = None  # (reason, seconds into the point) once stopped
        self._started = 0.0
        self.prefix_cache: PrefixCacheSummary | None = None  # set by finish()
        self._sampler: asyncio.Task | None = None

    async def _scrape_all(self) -> dict[str, str]:
        texts = await asyncio.gather(*(asyncio.to_thread(_get, url, 5.0) for _, _, url in self.targets))
        return {name: text for (name, _, _), text in zip(self.targets, texts, strict=False)}

    async def start(self) -> None:
        self.before = await self._scrape_all()
        self._started = time.monotonic()
        self._sampler = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            now = await self._scrape_all()
            for name, text in now.items():
                if text:
                    self.peaks[name] = gauge_peaks(text, self.peaks[name])
            self._check_early(now)

    def _check_early(self, now: dict[str, str]) -> None:
        after_s = time.monotonic() - self._started
        t = self.thresholds.early_check_s
        if self.early is not None or not t or after_s < t:
            return
        servers = {
            name: ServerScrapes(role=role, before=self.before.get(name, ""), after=now[name])
            for name, role, _ in self.targets
            if now.get(name) and role in ("prefill", "decode")
        }
        reason = early_reason(servers, self.completed(), self.thresholds, self.connector)
        if reason is None and (ev := self._early_transport) is not None and self.connector is not None:
            # The servers that count the transfers: decode where it pulls, prefill where it is pushed to.
            counting = {name: s for name, s in servers.items() if s.role == ev.counted_on}
            pairs = [(s.before, s.after) for s in counting.values()]
            reason = kv_transport.early_reason(pairs, self.kv_ceiling, self.thresholds, connector=self.connector)
            if reason is not None and self.logs_dir is not None:
                # The lane only names what failed: the log is read then, not every sample on the
                # client's event loop (up to ucx_lanes.MAX_BYTES of it).
                lane = lane_from_logs((self.logs_dir / log_name(name) for name in counting), ev)[0]
                reason = (
                    kv_transport.early_reason(pairs, self.kv_ceiling, self.thresholds, lane, self.connector) or reason
                )
        if reason is not None:
            self.early = (reason, after_s)
            self.on_invalid(reason)

    @property
    def disaggregated(self) -> bool:
        return any(role == "decode" for _, role, _ in self.targets)

    @property
    def _early_transport(self) -> KvEvidence | None:
        """The connector's evidence when the KV rate can be judged from a sample: NIXL's histograms
        count each transfer as it ends (on the entry's `counted_on`). The bundled connector's lines
        reach the client with the proxy's records, at the point's end: None."""
        if self.connector is None or not self.disaggregated:
            return None
        ev = kv_connectors.get_kv(self.connector).evidence
        return ev if ev is not None and ev.handoff == "vllm_nixl_metrics" else None

    async def cancel(self) -> None:
        """Stop sampling without a verdict: the point was not run after all."""
        if self._sampler:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)

    async def finish(self, client: ClientCounts) -> PointValidity:
        if self._sampler:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
        after = await self._scrape_all()
        verdict = self._evaluate(after, client)
        # A connector's transfer stats reach /metrics with a later engine step, so a scrape right
        # after the last response can miss the last receives: wait (bounded) for them to land.
        deadline = time.monotonic() + RECEIVES_SETTLE_S
        while receives_behind(verdict, client, self.connector) and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            after = await self._scrape_all()
            verdict = self._evaluate(after, client)
        self.prefix_cache = cache.summarize(self._servers(after), {name: url for name, _, url in self.targets})
        verdict = cache.with_prefix_cache(verdict, self.prefix_cache)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, phase, text in [(n, "before", t) for n, t in self.before.items()] + [
            (n, "after", t) for n, t in after.items()
        ]:
            scrape.save(self.out_dir, name, phase, text)
        return verdict if self.early is None else stopped_early(verdict, *self.early)

    def _servers(self, after: dict[str, str]) -> dict[str, ServerScrapes]:
        return {
            name: ServerScrapes(
                role=role, before=self.before.get(name, ""), after=after.get(name, ""), peaks=self.peaks[name]
            )
            for name, role, _ in self.targets
        }

    def _evaluate(self, after: dict[str, str], client: ClientCounts) -> PointValidity:
        return evaluate(self._servers(after), client, self.thresholds, self.connector)
