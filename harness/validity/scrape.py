"""Fetch a server's Prometheus /metrics and keep it as <out_dir>/<name>.<phase>.prom.

The one scraper of the run directory's .prom files: the node runtime's around the whole
sweep (metrics/) and the bench client's around each point (metrics/concurrency_<C>/).
"""

from __future__ import annotations

import http.client
import logging
import urllib.request
from pathlib import Path

from harness import atomic

log = logging.getLogger(__name__)

# vLLM's /metrics is a few hundred kB; a bound keeps a misbehaving target from filling memory.
MAX_SCRAPE_BYTES = 16 << 20
SCRAPE_ERRORS = (OSError, http.client.HTTPException, ValueError)


def fetch_metrics(base_url: str, timeout: float) -> str:
    """The text of <base_url>/metrics; raises OSError/HTTPException/ValueError when it cannot be had."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as r:
        return r.read(MAX_SCRAPE_BYTES).decode(errors="replace")


def save(out_dir: Path, name: str, phase: str, text: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    return atomic.write_text(out_dir / f"{name}.{phase}.prom", text)


def scrape_all(targets: dict[str, str], out_dir: Path, phase: str, timeout: float = 10.0) -> None:
    """targets: name -> base URL. A failed scrape is logged, not fatal: that file is missing."""
    for name, base in targets.items():
        try:
            save(out_dir, name, phase, fetch_metrics(base, timeout))
        except SCRAPE_ERRORS as e:
            log.warning("could not scrape %s/metrics: %s", base, e)
