"""The TTFT breakdown of each point (see harness.bench.ttft_breakdown): which points have one, and
the median of each part of TTFT in the order a request meets them.

The decode leg is split into the decode servers' mean KV transfer and the rest (an estimate: the
transfer has no per-request values) when the point has a transfer figure.
"""

from __future__ import annotations

from typing import Any

from harness.report.model import Breakdown
from harness.report.points import Run, serving


def median(b: dict[str, Any], key: str) -> float | None:
    part = b.get(key)
    return float(part["median"]) if isinstance(part, dict) and part.get("median") is not None else None


def parts(b: dict[str, Any]) -> dict[str, float]:
    """Bar segments in ms (medians), in the order a request meets them."""
    decode = median(b, "decode_ms") or 0.0
    kv = b.get("kv_transfer_ms", {}).get("mean") if isinstance(b.get("kv_transfer_ms"), dict) else None
    out = {"Proxy": median(b, "router_ms") or 0.0, "Prefill": median(b, "prefill_ms") or 0.0}
    if kv is not None:
        out["KV transfer"] = min(float(kv), decode)
        out["Decode"] = decode - out["KV transfer"]
    else:
        out["KV transfer"], out["Decode"] = 0.0, decode
    out["Client"] = max(0.0, median(b, "client_ms") or 0.0)
    return out


def breakdowns(runs: list[Run]) -> list[Breakdown]:
    """The points whose breakdown counts any request, in table order (shape, run, disagg first, conc)."""
    return sorted(
        (
            (run.label, serving(p), p.isl, p.osl, p.concurrency, p.ttft_breakdown)
            for run in runs
            for p in run.points
            if p.ttft_breakdown and p.ttft_breakdown.get("requests")
        ),
        key=lambda b: (b[2] or 0, b[3] or 0, b[0], b[1] != "disagg", b[4]),
    )
