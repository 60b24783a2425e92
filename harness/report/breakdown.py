"""The TTFT breakdown of each point (see harness.bench.ttft_breakdown): which points have one, and
the median of each part of TTFT in the order a request meets them.

The decode leg is split into the decode servers' mean KV transfer and the rest (an estimate: the
transfer has no per-request values) when the point has a transfer figure.

Beside it, the points' bottleneck verdicts as a table (the result's `bottleneck` section; the rules:
harness.validity.bottleneck), and per sweep (a run's points of one serving kind and shape, in
concurrency order) one line saying where the limit moves.
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import Any

from harness.report.model import BREAKDOWN_COLUMNS, Breakdown, SectionTable
from harness.report.points import Point, Run, serving
from harness.rundir.bottleneck_summary import BottleneckSummary, RoleTiming


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


# -- the bottleneck verdicts ---------------------------------------------------

BOTTLENECK_HEADERS = (
    "Run",
    "Serving",
    "ISL",
    "OSL",
    "Conc",
    "Verdict",
    "Dominant",
    "Prefill queue/compute",
    "Decode TPOT",
    "KV transfer",
    "Client CPU",
    "Why",
)


def _ms_text(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _grown(text: str, growth: float | None) -> str:
    return text if growth is None else f"{text} ({growth:.1f}x)"


def _prefill(r: RoleTiming | None, growth: float | None) -> str:
    if r is None:
        return "–"
    return _grown(f"{_ms_text(r.queue_ms)}/{_ms_text(r.compute_ms)}", growth)


def _row(run: Run, p: Point, b: BottleneckSummary) -> tuple[str, ...]:
    e = b.evidence
    decode = e.roles.get("decode") or e.roles.get("aggregated")  # an aggregated instance does both
    dominant = "–" if b.dominant is None else f"{b.dominant} {e.shares[b.dominant]:.0%}"
    return (
        run.label,
        serving(p),
        "–" if p.isl is None else str(p.isl),
        "–" if p.osl is None else str(p.osl),
        str(p.concurrency),
        b.verdict,
        dominant,
        _prefill(e.roles.get("prefill") or e.roles.get("aggregated"), e.growth.get("prefill")),
        _grown(_ms_text(decode.tpot_ms if decode else None), e.growth.get("decode")),
        _grown(_ms_text(e.kv_transfer_ms), e.kv_growth),
        "–" if e.client_cpu_busy is None else f"{e.client_cpu_busy:.0%}",
        "; ".join(b.reasons) or "no rule fired",
    )


def _key(run: Run, p: Point) -> tuple[str, str, int, int]:
    return (run.label, serving(p), p.isl or -1, p.osl or -1)


def limit_line(run: Run, points: list[Point]) -> str | None:
    """Where the limit moves along one sweep's points (concurrency order): "decode-bound from C=16";
    None for a sweep of fewer than two points with a verdict."""
    judged = [(p.concurrency, p.bottleneck.verdict) for p in points if p.bottleneck is not None]
    if len(judged) < 2:
        return None
    spans = [(v, [c for c, _ in grp]) for v, grp in groupby(judged, key=lambda cv: cv[1])]
    p0 = points[0]
    where = f"{run.label} ({serving(p0)}, ISL {p0.isl}, OSL {p0.osl})"
    if len(spans) == 1:
        return f"{where}: {spans[0][0]} at every concurrency (C={judged[0][0]}–{judged[-1][0]})"
    parts = [f"{v} at C={cs[0]}" + (f"–{cs[-1]}" if len(cs) > 1 else "") for v, cs in spans[:-1]]
    return f"{where}: {', '.join(parts)}; {spans[-1][0]} from C={spans[-1][1][0]}"


# The issue's bar for the breakdown: its parts add up to TTFT within 2 % for 95 % of requests.
ADDS_UP_SHARE = 0.95


def adds_up_finding(run: Run, p: Point) -> str | None:
    """A finding when fewer than ADDS_UP_SHARE of the point's requests have parts that add up."""
    a = (p.ttft_breakdown or {}).get("adds_up")
    if not isinstance(a, dict) or a.get("share") is None or a["share"] >= ADDS_UP_SHARE:
        return None
    return (
        f"{run.label} ({serving(p)}, C={p.concurrency}): the TTFT parts add up within {a['within']:.0%} "
        f"for {a['requests']} of {a['of']} requests ({a['share']:.0%}; the bar is {ADDS_UP_SHARE:.0%})"
    )


def bottleneck_table(runs: list[Run]) -> SectionTable | None:
    found = sorted(
        ((run, p) for run in runs for p in run.points if p.bottleneck is not None),
        key=lambda rp: (*_key(*rp), rp[1].concurrency),
    )
    if not found:
        return None
    rows = []
    for run, p in found:
        assert p.bottleneck is not None
        rows.append(_row(run, p, p.bottleneck))
    lines = []
    for _, grp in groupby(found, key=lambda rp: _key(*rp)):
        sweep = list(grp)
        line = limit_line(sweep[0][0], [p for _, p in sweep])
        if line is not None:
            lines.append(line)
    lines += [f for run, p in found if (f := adds_up_finding(run, p)) is not None]
    return SectionTable(
        "Bottleneck per point",
        BOTTLENECK_HEADERS,
        tuple(rows),
        "Verdict: the saturated resource whose part of TTFT is largest (client and router first), or "
        "'not saturated' (docs/decide.md gives the rules and thresholds). Dominant: the part of TTFT with "
        "the largest share of the per-request means. Prefill queue/compute, Decode TPOT and KV transfer "
        "are point means of vLLM's own histograms in ms, not per request; (Nx): growth over the sweep's "
        "lowest concurrency. Client CPU: the busiest load process.",
        tuple(lines),
    )
