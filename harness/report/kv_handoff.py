"""The points' KV handoff as a table (the result's `kv_handoff` section; how it is measured:
harness.validity.kv_handoff): per point the lane, the bytes, the rate per transfer and the shape
of the transfers, and a finding where NIXL split its transfers into one descriptor per block."""

from __future__ import annotations

from harness.report.model import SectionTable
from harness.report.points import Point, Run, serving
from harness.rundir.kv_handoff_summary import KvHandoffSummary
from harness.validity.kv_transport import SPLIT_BYTES, percent

HEADERS = (
    "Run",
    "Serving",
    "ISL",
    "Conc",
    "Connector",
    "Lane",
    "Transfers",
    "MiB each",
    "ms p50/p99",
    "GB/s mean",
    "GB/s p50/p99",
    "Descriptors",
    "Post",
    "Ceiling GB/s",
    "Share",
)


def _pair(a: float, b: float, fmt: str) -> str:
    return f"{a:{fmt}}/{b:{fmt}}"


def _row(run: Run, p: Point, h: KvHandoffSummary) -> tuple[str, ...]:
    t, g = h.transfer_ms, h.gbps
    return (
        run.label,
        serving(p),
        "–" if p.isl is None else str(p.isl),
        str(p.concurrency),
        h.connector,
        h.lane or "not proven",
        str(h.transfers),
        "–" if h.bytes_per_transfer is None else f"{h.bytes_per_transfer / (1 << 20):,.1f}",
        "–" if t is None else _pair(t.p50, t.p99, ".1f"),
        "–" if h.gbps_mean is None else f"{h.gbps_mean:.2f}",
        "–" if g is None else _pair(g.p50, g.p99, ".2f"),
        "–" if h.descriptors_per_transfer is None else f"{h.descriptors_per_transfer:,.0f}",
        "–" if h.post_share is None else f"{h.post_share:.0%}",
        "–" if h.ceiling_gbps is None else f"{h.ceiling_gbps:.1f}",
        _share(h),
    )


def _share(h: KvHandoffSummary) -> str:
    """The judged rate's share of the ceiling, with its flag."""
    if h.share is None:
        return "–"
    text = percent(h.share) if h.share < 0.1 else f"{h.share:.0%}"
    return text if h.flag is None else f"{text} {h.flag}"


def transport_finding(run: Run, p: Point, h: KvHandoffSummary) -> str | None:
    """A point the rule kv_transport flagged: below its share of the ceiling, or above the ceiling."""
    if h.flag is None or h.judged_gbps is None or h.ceiling_gbps is None:
        return None
    what = "is not valid: the transport fell back" if h.flag == "degraded_transport" else "is a metric error"
    return (
        f"{run.label} ({serving(p)}, C={p.concurrency}): {h.flag}: {h.judged_gbps:.2f} GB/s over "
        f"{h.judged_transfers} transfer(s), {_share(h).split()[0]} of the ceiling {h.ceiling}; {what}"
    )


def split_finding(run: Run, p: Point, h: KvHandoffSummary) -> str | None:
    """NIXL posted its transfers one small descriptor at a time: the rate is the posting's, not the lane's."""
    if h.bytes_per_descriptor is None or h.bytes_per_descriptor > SPLIT_BYTES:
        return None
    return (
        f"{run.label} ({serving(p)}, C={p.concurrency}): NIXL moved {h.bytes_per_descriptor / 1024:.0f} KiB per "
        f"descriptor ({h.descriptors_per_transfer:,.0f} per transfer): one descriptor per block and region, posted "
        f"one by one{'' if h.post_share is None else f' ({h.post_share:.0%} of the transfer time)'}; vLLM's block "
        "pool hands out descending blocks after it wrapped, which NIXL cannot merge (docs/gpu.md)"
    )


def kv_handoff_table(runs: list[Run]) -> SectionTable | None:
    found = [(run, p, p.kv_handoff) for run in runs for p in run.points if p.kv_handoff is not None]
    if not found:
        return None
    found.sort(key=lambda rph: (rph[0].label, serving(rph[1]), rph[1].isl or -1, rph[1].concurrency))
    return SectionTable(
        "KV handoff per point",
        HEADERS,
        tuple(_row(run, p, h) for run, p, h in found),
        "From the connector's own account of each point: the bundled connector's per-request records "
        "(exact percentiles; the lane it used: ipc or tcp) or vLLM's NIXL histograms on decode (mean rate "
        "exact; percentiles interpolated in buckets; UCX does not say its lane). ms: the transfer alone; "
        "GB/s p99: the slow tail (the rate of the p99 transfer time); Descriptors: NIXL's per transfer; "
        "Post: NIXL's time to post over its transfer time. Ceiling: the copy between prefill's and decode's "
        "devices measured in the same job before the sweep; Share: the rate of the transfers of at least "
        "validity.kv_judged_min_bytes against it (below validity.kv_min_ceiling_share: degraded_transport).",
        tuple(f for run, p, h in found for f in (transport_finding(run, p, h), split_finding(run, p, h)) if f),
    )
