"""The TTFT breakdown of each point (see harness.bench.ttft_breakdown): which points have one, and
the median of each part of TTFT in the order a request meets them.

The decode leg is split into the KV transfer and the rest when the point has a transfer figure:
the median of the per-request pulls where the bundled connector recorded them, else the decode
servers' mean over the point (an estimate: that transfer has no per-request values).
"""

from __future__ import annotations

import math
from typing import Any

from harness.report.model import BREAKDOWN_COLUMNS, Breakdown
from harness.report.points import Run, serving


def median(b: dict[str, Any], key: str) -> float | None:
    part = b.get(key)
    return float(part["median"]) if isinstance(part, dict) and part.get("median") is not None else None


def parts(b: dict[str, Any]) -> dict[str, float]:
    """Bar segments in ms (medians), in the order a request meets them."""
    decode = median(b, "decode_ms") or 0.0
    kv_part = b.get("kv_transfer_ms")
    kv = kv_part.get("median", kv_part.get("mean")) if isinstance(kv_part, dict) else None
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


def columns(b: dict[str, Any] | None) -> dict[str, float]:
    """A point's breakdown as table columns (BREAKDOWN_COLUMNS): NaN where the point has none or
    the part is absent (an aggregated point has no prefill leg, a point may lack a transfer figure)."""
    if not b or not b.get("requests"):
        return dict.fromkeys(BREAKDOWN_COLUMNS, math.nan)
    p = parts(b)
    present = {
        "ttft_proxy_ms": "router_ms" in b,
        "ttft_prefill_ms": "prefill_ms" in b,
        "ttft_kv_transfer_ms": "kv_transfer_ms" in b,
        "ttft_decode_ms": "decode_ms" in b,
        "ttft_client_ms": "client_ms" in b,
    }
    values = {
        "ttft_proxy_ms": p["Proxy"],
        "ttft_prefill_ms": p["Prefill"],
        "ttft_kv_transfer_ms": p["KV transfer"],
        "ttft_decode_ms": p["Decode"],
        "ttft_client_ms": p["Client"],
    }
    out = {"ttft_breakdown_requests": float(b["requests"])}
    out |= {k: v if present[k] else math.nan for k, v in values.items()}
    return out
