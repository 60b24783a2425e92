"""How a point's KV moved: bytes, transfers, the time and rate per transfer and the lane, from
what the connector itself reports (the format: harness.rundir.kv_handoff_summary).

Two sources, per connector (what each exports: harness/kv_connectors/<name>.py):
- the bundled connector writes one line per request on decode (connector/timings.py): its bytes,
  its pull and the pull's wait for prefill's answer, and whether the bytes came by CUDA IPC or TCP.
  The transfer is the pull less that wait, per request: exact percentiles and the proven lane.
- NIXL (vLLM's NixlPromMetrics, 0.20 and 0.32): the histograms `vllm:nixl_xfer_time_seconds`,
  `_post_time_seconds`, `_bytes_transferred` and `_num_descriptors` of the role that drives the
  transfers (the entry's `counted_on`: decode for the pull, one observation per completed read;
  prefill for the push, one per completed write). The point's deltas give sums and bucket counts:
  the mean rate is exact (bytes over time, summed); per-transfer quantiles are interpolated in the
  time buckets, and a transfer's rate is the mean bytes over its time (exact when every transfer
  has the same size: one prompt length). UCX does not tell vLLM which transport it used: the lane
  comes from UCX's own protocol selection in that role's log (harness.validity.ucx_lanes), where
  the job's logs are given.
Other connectors (Mooncake, MoRI-IO in vLLM 0.32) export no transfer sizes or times: no section.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness import kv_connectors
from harness.config.benchmark import ValidityThresholds
from harness.rundir.kv_handoff_summary import KvHandoffSummary, Spread
from harness.rundir.paths import log_name
from harness.validity.series import Scrape, delta
from harness.validity.ucx_lanes import lane_from_logs

NIXL = "vllm:nixl_"
MIN_BYTES = ValidityThresholds().kv_judged_min_bytes


def point_handoff(
    connector: str | None,
    targets: Sequence[tuple[str, str, str]],
    scrapes_dir: Path | None,
    records: Iterable[dict[str, Any]],
    min_bytes: int = MIN_BYTES,
    logs_dir: Path | None = None,
) -> KvHandoffSummary | None:
    """The point's section, from where the connector's entry says its handoff is recorded.
    `targets`: the point's scraped servers (name, role, url), whose scrapes lie in `scrapes_dir`
    as <name>.{before,after}.prom; `records`: the proxy's per-request records of the point, with
    the connector's line of each (its `connector` entry) where it wrote one; `min_bytes`: the
    smallest transfer the section's judged rate counts; `logs_dir`: where the servers' logs lie
    (NIXL's lane is read from those of the role that counts the transfers), None when the client
    was not given it."""
    if connector is None:
        return None
    source = kv_connectors.get_kv(connector).evidence
    if source is None:
        return None
    how = source.handoff
    if how == "connector_records":
        return from_connector_records(
            connector, (r["connector"] for r in records if isinstance(r.get("connector"), dict)), min_bytes
        )
    if how == "vllm_nixl_metrics" and scrapes_dir is not None:

        def text(name: str, phase: str) -> str:
            path = scrapes_dir / f"{name}.{phase}.prom"
            return path.read_text(errors="replace") if path.is_file() else ""

        names = [name for name, role, _ in targets if role == source.counted_on]
        pairs = [(text(name, "before"), text(name, "after")) for name in names]
        if logs_dir is None:
            return from_nixl_scrapes(pairs, min_bytes, connector=connector)
        lane, note = lane_from_logs((logs_dir / log_name(name) for name in names), source)
        return from_nixl_scrapes(pairs, min_bytes, lane, note, connector)
    return None


def from_connector_records(
    connector: str, lines: Iterable[dict[str, Any]], min_bytes: int = MIN_BYTES
) -> KvHandoffSummary | None:
    """The bundled connector's per-request lines of the point (successful pulls with their bytes);
    None when it recorded none."""
    sizes: list[float] = []
    times: list[float] = []
    lanes: set[str] = set()
    for line in lines:
        pull, wait, size = _number(line.get("pull_ms")), _number(line.get("pull_wait_ms")), _number(line.get("bytes"))
        if line.get("ok") is not True or pull is None or size is None or size <= 0:
            continue
        moving = pull - wait if wait is not None else pull
        if moving <= 0:
            continue
        sizes.append(size)
        times.append(moving)
        if isinstance(line.get("path"), str):
            lanes.add(line["path"])
    if not times:
        return None
    t, b = np.asarray(times), np.asarray(sizes)
    rates = b / (t * 1e6)  # bytes per ms -> GB/s
    large = b >= min_bytes
    return KvHandoffSummary(
        connector=connector,
        source="connector_records",
        transfers=len(times),
        bytes_total=float(b.sum()),
        bytes_per_transfer=float(b.mean()),
        transfer_ms=_spread(t, slow_is_high=True),
        gbps=_spread(rates, slow_is_high=False),
        gbps_mean=float(b.sum() / (t.sum() * 1e6)),
        lane="+".join(sorted(lanes)) or None,
        lane_note="the connector's own account per request (ipc: CUDA IPC on one host; tcp: its socket)",
        note="per request: the pull less its wait for prefill's answer (decode's clock)",
        judged_min_bytes=min_bytes,
        judged_transfers=int(large.sum()),
        judged_bytes=float(b[large].sum()) if large.any() else None,
        judged_gbps=float(b[large].sum() / (t[large].sum() * 1e6)) if large.any() else None,
    )


def from_nixl_scrapes(
    pairs: Sequence[tuple[str, str]],
    min_bytes: int = MIN_BYTES,
    lane: str | None = None,
    lane_note: str = "vLLM's NIXL metrics do not say which UCX transport carried the bytes (no server logs given)",
    connector: str = "nixl",
) -> KvHandoffSummary | None:
    """The (before, after) /metrics texts of the point of the servers that count the `connector`'s
    transfers (its entry's `counted_on`), and the lane with its note (harness.validity.ucx_lanes);
    None when no NIXL transfer was observed (or the servers export no NIXL histograms)."""
    ev = kv_connectors.get_kv(connector).evidence
    role = ev.counted_on if ev is not None else "decode"
    before = [Scrape.parse(b) for b, _ in pairs]
    after = [Scrape.parse(a) for _, a in pairs]

    def total(family: str) -> float | None:  # the point's delta, summed over the servers
        found = [d[0] for b, a in zip(before, after, strict=True) if (d := delta(b, a, family)) is not None]
        return sum(found) if found else None

    count = total(f"{NIXL}xfer_time_seconds_count")
    time_s = total(f"{NIXL}xfer_time_seconds_sum")
    if not count or count <= 0 or time_s is None or time_s <= 0:
        return None
    size = total(f"{NIXL}bytes_transferred_sum")
    post = total(f"{NIXL}post_time_seconds_sum")
    descriptors = total(f"{NIXL}num_descriptors_sum")
    buckets = _bucket_deltas(before, after, f"{NIXL}xfer_time_seconds_bucket")
    p50 = _quantile(buckets, 0.5)
    p99 = _quantile(buckets, 0.99)
    transfer_ms = None if p50 is None or p99 is None else Spread(p50=p50 * 1e3, p99=p99 * 1e3)
    mean_bytes = size / count if size is not None else None
    judged = mean_bytes is not None and mean_bytes >= min_bytes
    gbps = None
    if mean_bytes is not None and transfer_ms is not None and transfer_ms.p50 > 0 and transfer_ms.p99 > 0:
        gbps = Spread(p50=mean_bytes / (transfer_ms.p50 * 1e6), p99=mean_bytes / (transfer_ms.p99 * 1e6))
    return KvHandoffSummary(
        connector=connector,
        source="vllm_metrics",
        transfers=round(count),
        bytes_total=size,
        bytes_per_transfer=mean_bytes,
        descriptors_per_transfer=None if descriptors is None else descriptors / count,
        bytes_per_descriptor=None if size is None or not descriptors else size / descriptors,
        transfer_ms=transfer_ms,
        gbps=gbps,
        gbps_mean=None if size is None else size / (time_s * 1e9),
        post_share=None if post is None else post / time_s,
        lane=lane,
        lane_note=lane_note,
        note=(
            f"{role}'s NIXL histograms over the point: the mean rate is bytes over time summed; "
            "percentiles interpolated in the time buckets, rates as the mean bytes over those times"
        ),
        judged_min_bytes=min_bytes,
        judged_transfers=round(count) if judged else 0,
        judged_bytes=size if judged else None,
        judged_gbps=size / (time_s * 1e9) if judged and size is not None else None,
    )


def _number(v: Any) -> float | None:
    """A finite number of a JSON line, else None."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _spread(values: np.ndarray, slow_is_high: bool) -> Spread:
    """Percentiles of per-transfer values; for rates (slow_is_high False) p99 is the slow tail."""
    q = 99 if slow_is_high else 1
    return Spread(
        p50=float(np.percentile(values, 50)),
        p99=float(np.percentile(values, q)),
        min=float(values.min()),
        max=float(values.max()),
    )


def _bucket_deltas(before: Sequence[Scrape], after: Sequence[Scrape], family: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) over the point, summed over servers and engines, by bound."""
    counts: dict[float, float] = {}
    for b, a in zip(before, after, strict=True):
        prev = {(s.labels, s.label("le")): s.value for s in b.find(family)}
        for s in a.find(family):
            le = s.label("le")
            if le is None:
                continue
            bound = math.inf if le in ("+Inf", "inf") else float(le)
            counts[bound] = counts.get(bound, 0.0) + s.value - prev.get((s.labels, le), 0.0)
    return sorted(counts.items())


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus's histogram_quantile: linear within the bucket holding rank q * total; a rank in
    the +Inf bucket answers the highest finite bound (as Prometheus does)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, cumulative
    return lower


def describe(h: KvHandoffSummary) -> str:
    """One line for the job's log: how many transfers of what size, at what rate, by which lane."""
    size = "" if h.bytes_per_transfer is None else f" of {h.bytes_per_transfer / (1 << 20):,.1f} MiB"
    rate = "" if h.gbps_mean is None else f", {h.gbps_mean:.2f} GB/s mean"
    if h.gbps is not None:
        rate += f" (p50 {h.gbps.p50:.2f}, slow tail {h.gbps.p99:.2f})"
    shape = "" if h.descriptors_per_transfer is None else f", {h.descriptors_per_transfer:,.0f} descriptors each"
    return f"KV handoff: {h.transfers} transfers{size}{rate}{shape}, lane {h.lane or 'not proven'}"
