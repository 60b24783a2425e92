"""Save every server's Prometheus /metrics around the sweep, so a run can prove that KV was
transferred (decode's external prefix-cache hits) instead of recomputed."""

from __future__ import annotations

import http.client
import logging
import os
import urllib.request
from pathlib import Path

log = logging.getLogger("pdbench.node")


def scrape_all(targets: dict[str, str], out_dir: Path, phase: str, timeout: float = 10.0) -> None:
    """targets: name -> base URL. Writes <out_dir>/<name>.<phase>.prom; a failed scrape is logged, not fatal."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, base in targets.items():
        try:
            with urllib.request.urlopen(f"{base}/metrics", timeout=timeout) as r:
                text = r.read()
        except (OSError, http.client.HTTPException) as e:
            log.warning("could not scrape %s/metrics: %s", base, e)
            continue
        tmp = out_dir / f".{name}.{phase}.prom.tmp"
        tmp.write_bytes(text)
        os.replace(tmp, out_dir / f"{name}.{phase}.prom")
