"""Where a point's TTFT goes: the client's measured TTFT of each request split, on the proxy's
clock, into the proxy's own time, the prefill leg, the decode leg up to its first byte and the
rest (the client's send and the proxy's relay back).

Per request (the proxy's record of it, matched by X-Pdbench-Id; see harness.rundir.proxy_timings):
    router_ms   arrival at the proxy -> first leg sent
    prefill_ms  prefill queue and compute (absent for an aggregated instance)
    decode_ms   decode leg -> first byte: KV transfer, decode scheduling, first token
    client_ms   the client's TTFT - the proxy's arrival-to-first-byte time
router + prefill + decode is the proxy's arrival-to-first-byte time less any gap between the
legs (decode sent after prefill answered), so with client_ms the parts add up to each request's
TTFT; medians and p99s of the parts are over the requests.

decode_ms is split, never added to. Where the bundled connector recorded the request (its line
joined to the proxy's record, harness.rundir.proxy_timings; fields in connector/timings.py):
    kv_transfer_ms        the pull: request sent -> ack (decode worker's clock); from prefill's
                          answer on where decode asked before prefill finished (overlapped flow:
                          the wait lies in prefill_ms)
    decode_first_step_ms  decode's first step after the load: metadata bound -> forward returned
    decode_other_ms       decode_ms less both: decode's front end and queue, the load's hand-off
                          and report, sampling and the relay of the first token
per request, with their mean/median/p99 and the requests they cover (`requests`);
kv_transfer_ms's `whole_pull_mean` is the same requests' mean whole pull (request -> ack, an early
pull's wait for prefill included), the KV figure the verdict takes (verdict_kv_ms). A request whose
pull and first step exceed its decode leg (the pull began before the leg did: in the overlapped
flow prefill answers the pull before its HTTP answer reaches the proxy) has no split: a negative
decode_other_ms is no time. It is left out of all three parts, so they still add up to each split
request's decode_ms, and counted in `decode_split_left_out`. Otherwise (other
connectors) the KV transfer comes from the connector's own histograms over the point on the role
that counts its transfers (decode's reads; prefill's writes for NIXL's push; their mean, labelled a
point mean), and `decode_first_token_ms` is the median decode leg less that
mean, an estimate labelled as such (decode's first step as vLLM measured it is
`server_means.decode.compute_ms`, a point mean).

Beside the per-request parts, `server_means` gives each role's queue and compute per request
from vLLM's own histograms (vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds,
vllm:request_time_per_output_token_seconds) as before/after deltas over the point: means over the
point, not per request (harness.rundir.bottleneck_summary.RoleTiming says what each one counts).
`adds_up` checks per request that router + prefill + decode + client is the client's TTFT within
ADDS_UP_WITHIN (a gap between the proxy's legs is the only time the parts leave out).
`judge_point` gives the point's `bottleneck` section (harness.validity.bottleneck).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.bench.client import RequestOutput
from harness.rundir.bottleneck_summary import Baseline, RoleTiming
from harness.validity import PointValidity
from harness.validity.bottleneck import judge
from harness.validity.kv_evidence import evidence_for
from harness.validity.series import Scrape, delta

PARTS = ("router_ms", "prefill_ms", "decode_ms", "client_ms")
DECODE_SPLIT = ("kv_transfer_ms", "decode_first_step_ms", "decode_other_ms")  # of decode_ms, per request
ADDS_UP_WITHIN = 0.02
PER_REQUEST = "per request: ttft_ms and its parts router_ms, prefill_ms, decode_ms, client_ms"
PER_REQUEST_SPLIT = f"{PER_REQUEST}; decode_ms split into {', '.join(DECODE_SPLIT)} (the bundled connector's records)"
POINT_MEANS = "point means, not per request: kv_transfer_ms, server_means (vLLM's histograms over the point)"
POINT_MEANS_SPLIT = "point means, not per request: server_means (vLLM's histograms over the point)"
LEFT_OUT = (
    "the connector's pull + first step exceed the proxy's decode leg (the pull began before the leg did): "
    "decode_ms not split"
)
SPLIT_SOURCE = {
    "kv_transfer_ms": "per request: the bundled connector's pull, request -> ack (decode worker)",
    "decode_first_step_ms": "per request: decode's first step, metadata bound -> forward returned (decode worker)",
    "decode_other_ms": "per request: decode_ms - kv_transfer_ms - decode_first_step_ms",
}
_HIST = {
    "queue_ms": r"vllm:request_queue_time_seconds",
    "compute_ms": r"vllm:request_prefill_time_seconds",
    "tpot_ms": r"vllm:request_time_per_output_token_seconds",
}


def kv_transfer_ms(verdict: PointValidity | None, connector: str | None = None) -> tuple[float, int] | None:
    """(mean ms per transfer, transfers) over the point, from the /metrics of the servers that count
    the connector's transfers (its entry's `counted_on`: decode's reads, or prefill's pushed writes)."""
    if verdict is None:
        return None
    counted = verdict.roles.get(evidence_for(connector).counted_on)
    if counted is None or not counted.transfer_seconds or not counted.transfer_count:
        return None
    return counted.transfer_seconds / counted.transfer_count * 1000.0, int(counted.transfer_count)


def role_timings(scrapes: list[tuple[str, str, str]]) -> dict[str, RoleTiming]:
    """Each role's means over the point from (role, before, after) scrape texts of its servers,
    summed over instances; a role whose servers export none of the histograms is left out."""
    sums: dict[str, dict[str, tuple[float, float]]] = {}
    for role, before, after in scrapes:
        if role == "proxy" or not after:
            continue
        b, a = Scrape.parse(before), Scrape.parse(after)
        acc = sums.setdefault(role, {})
        for key, name in _HIST.items():
            total, count = delta(b, a, f"{name}_sum"), delta(b, a, f"{name}_count")
            # A server restarted during the point counts from zero again: its deltas say nothing.
            if total is not None and count is not None and total[0] >= 0 and count[0] > 0:
                t0, c0 = acc.get(key, (0.0, 0.0))
                acc[key] = (t0 + total[0], c0 + count[0])
    out = {}
    for role, acc in sums.items():
        if not acc:
            continue
        mean = {k: round(t / c * 1000.0, 4) if c > 0 else None for k, (t, c) in acc.items()}
        requests = int(max(c for _, c in acc.values()))
        out[role] = RoleTiming(requests=requests, **mean)
    return out


def read_role_timings(targets: list[tuple[str, str, str]], directory: Path) -> dict[str, RoleTiming]:
    """role_timings of the point's scrapes as the probe saved them: <directory>/<name>.{before,after}.prom;
    `targets`: (name, role, url) as the probe parsed them. A missing file counts as no scrape."""

    def text(name: str, phase: str) -> str:
        path = directory / f"{name}.{phase}.prom"
        return path.read_text(errors="replace") if path.is_file() else ""

    return role_timings([(role, text(name, "before"), text(name, "after")) for name, role, _ in targets])


def decode_split(rec: dict[str, Any]) -> tuple[float, float, float] | None:
    """(kv_transfer_ms, decode_first_step_ms, decode_other_ms) of a proxy record whose request
    the bundled connector recorded with a successful pull; None otherwise. decode_other_ms is
    negative where the connector's durations exceed the decode leg (see LEFT_OUT)."""
    line = rec.get("connector")
    if not isinstance(line, dict) or line.get("ok") is not True:
        return None
    pull, first, wait = line.get("pull_ms"), line.get("first_step_ms"), line.get("pull_wait_ms")
    if not isinstance(pull, (int, float)) or not isinstance(first, (int, float)):
        return None
    if line.get("early") is True:  # the overlapped flow: its wait for prefill is in prefill_ms
        if not isinstance(wait, (int, float)):
            return None
        pull -= wait
    return float(pull), float(first), rec["decode_ms"] - pull - first


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
    servers: dict[str, RoleTiming] | None = None,
) -> dict[str, Any]:
    """The point's breakdown: per part mean/median/p99 over the successful requests the proxy
    recorded, and each role's point means (`servers`, from role_timings) beside them."""
    parts: dict[str, list[float]] = {p: [] for p in ("ttft_ms", *PARTS, *DECODE_SPLIT)}
    within = overrun = 0
    whole_pulls: list[float] = []  # of the split requests: request -> ack, an early pull's wait included
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
        split = decode_split(rec)
        if split is not None and split[2] < 0:
            overrun += 1
        elif split is not None:
            for key, value in zip(DECODE_SPLIT, split, strict=True):
                parts[key].append(value)
            whole_pulls.append(float(rec["connector"]["pull_ms"]))
        parts["client_ms"].append(ttft - rec["first_byte_ms"])
        total = rec["router_ms"] + rec.get("prefill_ms", 0.0) + rec["decode_ms"] + parts["client_ms"][-1]
        within += abs(total - ttft) <= ADDS_UP_WITHIN * ttft
    done = sum(1 for o in outs if o.success)
    out: dict[str, Any] = {"requests": len(parts["ttft_ms"]), "of": done}
    if not parts["ttft_ms"]:
        out["note"] = "the proxy recorded none of this point's requests"
        return out
    per_request = bool(parts["kv_transfer_ms"])
    out["per_request"] = PER_REQUEST_SPLIT if per_request else PER_REQUEST
    out["point_means"] = POINT_MEANS_SPLIT if per_request else POINT_MEANS
    out.update({k: _stats(v) for k, v in parts.items() if v and k not in DECODE_SPLIT})
    n = len(parts["ttft_ms"])
    out["adds_up"] = {"within": ADDS_UP_WITHIN, "requests": within, "of": n, "share": round(within / n, 4)}
    if per_request:
        for key in DECODE_SPLIT:
            out[key] = {**_stats(parts[key]), "requests": len(parts[key]), "source": SPLIT_SOURCE[key]}
        out["kv_transfer_ms"]["whole_pull_mean"] = round(float(np.mean(whole_pulls)), 4)
    elif kv is not None:
        mean, count = kv
        out["kv_transfer_ms"] = {
            "mean": round(mean, 4),
            "transfers": count,
            "source": "point mean: the /metrics of the servers that count the transfers (no per-request records)",
        }
        out["decode_first_token_ms"] = {
            "median": round(max(0.0, out["decode_ms"]["median"] - mean), 4),
            "estimate": "median decode leg - mean KV transfer",
        }
    if overrun:
        out["decode_split_left_out"] = {"requests": overrun, "why": LEFT_OUT}
    if servers:
        out["server_means"] = {role: t.model_dump(mode="json") for role, t in servers.items()}
    return out


def _means(b: dict[str, Any] | None) -> dict[str, float] | None:
    if not b or not b.get("requests"):
        return None
    return {k: float(b[k]["mean"]) for k in ("ttft_ms", *PARTS) if isinstance(b.get(k), dict)}


def verdict_kv_ms(breakdown: dict[str, Any] | None, kv: tuple[float, int] | None) -> float | None:
    """The KV transfer's mean the verdict takes: where the bundled connector timed each request,
    the mean of their whole pulls (`whole_pull_mean`), else the mean over the point of the servers
    that count the transfers (`kv`, from /metrics: decode's, prefill's for a push). Both are the
    whole transfer, which the decode rule takes out of decode's queue: vLLM queues a request until
    its KV has landed, and in the overlapped flow that includes the pull's wait for prefill (which
    kv_transfer_ms's split leaves out)."""
    own = (breakdown or {}).get("kv_transfer_ms")
    if isinstance(own, dict) and isinstance(own.get("whole_pull_mean"), (int, float)):
        return float(own["whole_pull_mean"])
    return kv[0] if kv is not None and kv[0] >= 0 else None


def judge_point(
    concurrency: int,
    breakdown: dict[str, Any] | None,
    servers: dict[str, RoleTiming],
    kv: tuple[float, int] | None,
    tpot_ms: float | None,
    client: dict[str, Any] | None,
    bases: dict[str | None, Baseline],
    shape: str | None,
    *,
    e2el_ms: float | None,
) -> dict[str, Any]:
    """The point's `bottleneck` section; `bases` keeps, per shape, the lowest-concurrency point
    measured so far: growth is against it, and this point replaces it when lower. The KV transfer
    is verdict_kv_ms's (`kv`: the counting servers' point mean, for connectors without per-request
    records). `e2el_ms`: the client's mean E2EL (None: not measured), by which the verdict weighs
    each role's time."""
    base = bases.get(shape)
    kv_ms = verdict_kv_ms(breakdown, kv)
    summary = judge(
        _means(breakdown),
        servers,
        kv_ms,
        tpot_ms,
        client,
        base if base is not None and base.concurrency < concurrency else None,
        e2el_ms=e2el_ms,
    )
    if base is None or concurrency < base.concurrency:
        bases[shape] = Baseline(concurrency=concurrency, roles=servers, kv_transfer_ms=kv_ms)
    return summary.model_dump(mode="json")
