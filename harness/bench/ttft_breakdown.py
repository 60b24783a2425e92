"""Where a point's TTFT goes: the client's measured TTFT of each request split, on the proxy's
clock, into the proxy's own time, the prefill leg, the decode leg up to its first byte and the
rest (the client's send and the proxy's relay back).

Per request (the proxy's record of it, matched by X-Pdbench-Id; see harness.rundir.proxy_timings):
    router_ms   arrival at the proxy -> first leg sent, plus any gap between the legs
    prefill_ms  prefill queue and compute (absent for an aggregated instance)
    decode_ms   decode leg -> first byte: KV transfer, decode scheduling, first token
    client_ms   the client's TTFT - the proxy's arrival-to-first-byte time
router + prefill + decode is the proxy's arrival-to-first-byte time, so with client_ms the
parts add up to each request's TTFT; medians and p99s of the parts are over the requests.
The KV transfer inside decode_ms comes from the decode servers' own histograms over the
point (their mean: no per-request values), `decode_first_token_ms` is the median decode leg
less that mean, an estimate labelled as such.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.bench.client import RequestOutput
from harness.validity import PointValidity

PARTS = ("router_ms", "prefill_ms", "decode_ms", "client_ms")


def kv_transfer_ms(verdict: PointValidity | None) -> tuple[float, int] | None:
    """(mean ms per transfer, transfers) of the decode servers over the point, from /metrics."""
    if verdict is None:
        return None
    decode = verdict.roles.get("decode")
    if decode is None or not decode.transfer_seconds or not decode.transfer_count:
        return None
    return decode.transfer_seconds / decode.transfer_count * 1000.0, int(decode.transfer_count)


def _stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {
        "mean": round(float(a.mean()), 4),
        "median": round(float(np.median(a)), 4),
        "p99": round(float(np.percentile(a, 99)), 4),
    }


def ttft_breakdown(
    outs: list[RequestOutput],
    ids: list[str],
    records: dict[str, dict[str, Any]],
    kv: tuple[float, int] | None,
) -> dict[str, Any]:
    """The point's breakdown: per part mean/median/p99 over the successful requests the proxy recorded."""
    parts: dict[str, list[float]] = {p: [] for p in ("ttft_ms", *PARTS)}
    for o, rid in zip(outs, ids, strict=True):
        rec = records.get(rid)
        if rec is None or not o.success or not o.ttft:
            continue
        ttft = o.ttft * 1000.0
        parts["ttft_ms"].append(ttft)
        parts["router_ms"].append(rec["router_ms"])
        if "prefill_ms" in rec:
            parts["prefill_ms"].append(rec["prefill_ms"])
        parts["decode_ms"].append(rec["decode_ms"])
        parts["client_ms"].append(ttft - rec["first_byte_ms"])
    done = sum(1 for o in outs if o.success)
    out: dict[str, Any] = {"requests": len(parts["ttft_ms"]), "of": done}
    if not parts["ttft_ms"]:
        out["note"] = "the proxy recorded none of this point's requests"
        return out
    out.update({k: _stats(v) for k, v in parts.items() if v})
    if kv is not None:
        mean, count = kv
        out["kv_transfer_ms"] = {"mean": round(mean, 4), "transfers": count, "source": "decode servers' /metrics"}
        out["decode_first_token_ms"] = {
            "median": round(max(0.0, out["decode_ms"]["median"] - mean), 4),
            "estimate": "median decode leg - mean KV transfer",
        }
    return out
