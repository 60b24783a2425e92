"""Scrape every server's /metrics around one benchmark point and judge the point's validity.

The scrapes are kept under <result_dir>/metrics/concurrency_<C>/ (before and after); the
gauge samples taken during the point are folded into running peaks as they arrive, so memory
stays bounded however long the point runs. The verdict goes into the result's metadata as
`valid` and `validity` (see harness.validity).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from harness.validity import (
    ClientCounts,
    PointValidity,
    ServerScrapes,
    ValidityThresholds,
    evaluate,
    gauge_peaks,
    scrape,
)

SAMPLE_INTERVAL_S = 2.0


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
    def __init__(self, targets: list[str], out_dir: Path, thresholds: ValidityThresholds):
        self.targets = [parse_target(t) for t in targets]
        self.out_dir, self.thresholds = out_dir, thresholds
        self.before: dict[str, str] = {}
        self.peaks: dict[str, dict[str, float]] = {name: {} for name, _, _ in self.targets}
        self._sampler: asyncio.Task | None = None

    async def _scrape_all(self) -> dict[str, str]:
        texts = await asyncio.gather(*(asyncio.to_thread(_get, url, 5.0) for _, _, url in self.targets))
        return {name: text for (name, _, _), text in zip(self.targets, texts, strict=False)}

    async def start(self) -> None:
        self.before = await self._scrape_all()
        self._sampler = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            for name, text in (await self._scrape_all()).items():
                if text:
                    self.peaks[name] = gauge_peaks(text, self.peaks[name])

    async def finish(self, client: ClientCounts) -> PointValidity:
        if self._sampler:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
        after = await self._scrape_all()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, phase, text in [(n, "before", t) for n, t in self.before.items()] + [
            (n, "after", t) for n, t in after.items()
        ]:
            scrape.save(self.out_dir, name, phase, text)
        servers = {
            name: ServerScrapes(
                role=role, before=self.before.get(name, ""), after=after.get(name, ""), peaks=self.peaks[name]
            )
            for name, role, _ in self.targets
        }
        return evaluate(servers, client, self.thresholds)
