"""A run's points as the predictor sees them: one Observation per result file, from the report's
reader (harness.report.load) plus the per-request TTFTs the result file keeps."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.predict.simulate import seen_batch
from harness.report.load import RunPathError, load_runs
from harness.report.points import Point, serving


class ObservationError(Exception):
    """A run or result that cannot be profiled; the message names the file and the key."""


@dataclass(frozen=True)
class Observation:
    path: Path
    phase: str  # disagg | agg
    concurrency: int
    isl: int
    osl: int
    ttft_ms: dict[str, float]  # mean, p50, p90, p99
    ttft_min_ms: float  # the fastest request's TTFT: the least queued one
    tpot_ms: float  # mean
    e2el_ms: float  # mean
    output_throughput: float  # tokens/s
    requests: int  # sent in the point (completed + failed, else num_prompts)
    prefill_workers: int
    decode_workers: int  # 0: aggregated
    prefill_gpus: int  # aggregated: all of them
    decode_gpus: int
    overhead_ms: float | None  # proxy + client time per request (ttft_breakdown), median
    kv_ms: float | None  # KV hand-off per request, median (ttft_breakdown or kv_handoff)
    kv_source: str
    # Sequences decoding alongside a request over its decode, all decode instances together,
    # from the client's per-request start, TTFT and latency (harness.predict.simulate.seen_batch);
    # None where the result file does not keep them.
    decode_batch_seen: float | None = None
    # Disaggregated: the proxy's per-request legs (ttft_breakdown medians): from sending the
    # prompt to prefill to prefill's answer, and from that answer to decode's first token.
    prefill_leg_ms: float | None = None
    decode_leg_ms: float | None = None

    @property
    def gpus(self) -> int:
        return self.prefill_gpus + self.decode_gpus


def _need(p: Point, key: str) -> float:
    v = p.ms.get(key)
    if v is None or not math.isfinite(v):
        raise ObservationError(f"{p.path}: no {key}: the predictor needs TTFT and TPOT of every point")
    return v


def _int(md: dict[str, Any], key: str, default: int) -> int:
    v = md.get(key, default)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ObservationError(f"metadata.{key} is not a non-negative integer ({v!r})")
    return v


def _median(block: Any, part: str) -> float | None:
    if isinstance(block, dict) and isinstance(block.get(part), dict):
        v = block[part].get("median")
        if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0:
            return float(v)
    return None


def _kv(p: Point) -> tuple[float | None, str]:
    kv = _median(p.ttft_breakdown, "kv_transfer_ms")
    if kv is not None:
        return kv, "ttft_breakdown"
    h = p.kv_handoff
    if h is not None and h.bytes_per_transfer and h.gbps is not None and h.gbps.p50 > 0:
        return h.bytes_per_transfer / (h.gbps.p50 * 1e9) * 1000.0, "kv_handoff"
    return None, "none"


def observe(p: Point) -> Observation:
    if p.isl is None or p.osl is None:
        raise ObservationError(f"{p.path}: no isl/osl (random_input_len, random_output_len)")
    md = p.metadata
    phase = serving(p)
    try:
        if phase == "agg":
            pw, dw = _int(md, "num_workers", 1) or 1, 0
        else:
            pw, dw = _int(md, "prefill_num_workers", 1) or 1, _int(md, "decode_num_workers", 1) or 1
    except ObservationError as e:
        raise ObservationError(f"{p.path}: {e}") from None
    try:
        doc = json.loads(p.path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ObservationError(f"{p.path}: unreadable: {e}") from None
    raw = doc.get("ttfts") if isinstance(doc, dict) else None
    ttfts = [float(t) * 1000.0 for t in raw or [] if isinstance(t, (int, float)) and t > 0]
    ttft = {k: _need(p, f"{k}_ttft_ms") for k in ("mean", "p90", "p99")} | {"p50": _need(p, "median_ttft_ms")}
    b = p.ttft_breakdown
    parts = [_median(b, k) for k in ("router_ms", "client_ms")]
    overhead = sum(x for x in parts if x is not None) if any(x is not None for x in parts) else None
    kv, kv_source = _kv(p) if phase == "disagg" else (None, "none")
    return Observation(
        path=p.path,
        phase=phase,
        concurrency=p.concurrency,
        isl=p.isl,
        osl=p.osl,
        ttft_ms=ttft,
        ttft_min_ms=min(ttfts) if ttfts else ttft["p50"],
        tpot_ms=_need(p, "mean_tpot_ms"),
        e2el_ms=_need(p, "mean_e2el_ms"),
        output_throughput=p.output_throughput,
        requests=p.requests or p.completed or 0,
        prefill_workers=pw,
        decode_workers=dw,
        prefill_gpus=p.prefill_gpus or 0,
        decode_gpus=p.decode_gpus or 0,
        overhead_ms=overhead,
        kv_ms=kv,
        kv_source=kv_source,
        decode_batch_seen=_seen(doc),
        prefill_leg_ms=_median(b, "prefill_ms") if phase == "disagg" else None,
        decode_leg_ms=_median(b, "decode_ms") if phase == "disagg" else None,
    )


def _seen(doc: Any) -> float | None:
    """The batch a request decoded alongside (seen_batch) from the result's per-request lists:
    decode runs from a request's first token (start + TTFT) to its last (start + latency)."""
    if not isinstance(doc, dict):
        return None
    starts, ttfts, lats = (doc.get(k) for k in ("start_times", "ttfts", "latencies"))
    if not (isinstance(starts, list) and isinstance(ttfts, list) and isinstance(lats, list)):
        return None
    if not len(starts) == len(ttfts) == len(lats):
        return None
    spans = []
    for s, t, lat in zip(starts, ttfts, lats, strict=True):
        if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (s, t, lat)) and 0 < t < lat:
            spans.append((s + t, s + lat))
    return seen_batch(spans)


def observations(run_path: Path) -> list[Observation]:
    """Every point of one run (both phases), in concurrency order; a run without points is refused."""
    try:
        loaded = load_runs([run_path])
    except RunPathError as e:
        raise ObservationError(str(e)) from None
    points = [p for run in loaded.runs for p in run.points]
    if not points:
        why = "; ".join(f"{s.path.name}: {s.reason}" for s in loaded.skipped[:3])
        raise ObservationError(f"{run_path}: no result files to profile" + (f" ({why})" if why else ""))
    return sorted((observe(p) for p in points), key=lambda o: (o.phase, o.isl, o.osl, o.concurrency))
