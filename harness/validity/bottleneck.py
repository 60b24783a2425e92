"""A point's bottleneck verdict: which part of TTFT dominates and which resource is saturated.

Pure rules over numbers the point already has (no I/O). The parts' shares come from the TTFT
breakdown's per-request parts (their means over the requests, as shares of the mean TTFT); the
roles' queue and compute times are point means of vLLM's own histograms; growth is against the
sweep's lowest-concurrency point of the same shape (`Baseline`), absent at that point itself.

A resource is saturated when (thresholds below, each with its why):
- client: its busiest load process was >= CLIENT_CPU busy, or its event-loop lag p99 is >= MIN_SHARE
  of TTFT, or the client's part is >= CLIENT_SHARE of TTFT. The client section's own warnings
  (lag p99 over 5 ms) stay in the evidence: a few ms of lag flags the measurement, not the limit.
- router: the proxy's own time is >= ROUTER_SHARE of TTFT.
- prefill: prefill's queue mean >= QUEUE_OVER_COMPUTE x its compute mean, or its queue + compute
  per request grew >= GROWTH x over the baseline.
- decode: its TPOT, or its queue + first step less the KV transfer's mean (growth key
  DECODE_WAIT), grew >= GROWTH x. Its queue alone says little: vLLM counts the whole wait for the
  remote KV (the connector's handshake, polling and transfer) as decode's queue, already as long
  as its first step at C=1 on CPU; but its growth beyond the transfer's is the wait for a place
  in decode's full steps. On real vLLM (ISL 16 / OSL 256, 64 streams on decode's one core) TPOT
  grew 2.6-5.9x from run to run, that wait 5.1-18.5x; with long prompts (ISL 2048 / OSL 2, C=8,
  prefill-bound) the wait stayed at 0.9x.
- transfer: the KV transfer's mean grew >= GROWTH x and its share of TTFT is >= MIN_SHARE.
The KV transfer's mean is the caller's (harness.bench.ttft_breakdown.verdict_kv_ms): the whole
pull's mean over the requests where the bundled connector timed each one, else the decode
servers' point mean of it.
An aggregated instance (no prefill or decode role) is judged as both: its queue and compute as
prefill's, its TPOT as decode's (growth keys "prefill" and "decode" then name those sides).
The verdict: client-bound first (the point's latencies then include the client's delay), then
router-bound, then of prefill / transfer / decode the saturated one in which a request spends the
most time: its part of TTFT, and for decode also the rest of the request (mean E2EL - mean TTFT,
every token after the first), which TTFT's shares leave out. By TTFT alone a long-output job on
real vLLM (1P1D, ISL 16 / OSL 256, decode on one core) was a coin toss: prefill's growth rule
fires too there (the C prompts of a closed loop arrive together: 3-7x on a 16-token prefill), and
decode's share of TTFT was 0.53-0.72 against prefill's 0.25-0.44 at C=16-64, although a request
spent 2-9 s in decode against 0.05-0.16 s in prefill. Without the proxy's parts, the largest growth decides;
"not saturated" when no rule fired.
"""

from __future__ import annotations

from typing import Any

from harness.rundir.bottleneck_summary import Baseline, BottleneckSummary, Evidence, Resource, RoleTiming, Verdict

# The sweep's own bound for a load process (harness.bench.load_runner.BUSY_WARN): above it the client
# reads responses late and its delay enters every latency.
CLIENT_CPU = 0.9
# A client part of a fifth of TTFT is time spent in the client's send and read, not the servers'.
CLIENT_SHARE = 0.2
# A proxy adds milliseconds; a fifth of TTFT spent in it means requests wait for the proxy itself.
ROUTER_SHARE = 0.2
# vLLM's chunked prefill schedules a waiting prompt as soon as its token budget allows, so at low
# load queue time is ~0 against tens of ms of compute; half the compute spent waiting means
# arrivals outrun what the role's batches take.
QUEUE_OVER_COMPUTE = 0.5
# A role that batches absorbs load by sharing its steps: its compute per request grows instead of
# its queue. Doubling over the sweep's lowest concurrency is beyond what two requests sharing the
# role's steps cost (C=2 on the 1P1D/1P2D/2P1D CPU grids: 1.0-1.6x) and what a role whose steps
# are full shows (C=16: 3.5-5.3x).
GROWTH = 2.0
# A part under a tenth of TTFT cannot be what limits TTFT, whatever its growth.
MIN_SHARE = 0.1
# Growth's key for decode's queue + first step less the KV transfer's mean, beside its TPOT's.
DECODE_WAIT = "decode_wait"

_ORDER: tuple[Resource, ...] = ("prefill", "transfer", "decode")


def shares(parts: dict[str, float] | None, kv_ms: float | None) -> tuple[float | None, dict[str, float]]:
    """(mean TTFT, each part's share of it) from the breakdown's per-request means (ms): router_ms,
    prefill_ms, decode_ms, client_ms, ttft_ms. The decode leg is split into the KV transfer's mean
    and the rest when the transfer's mean is known."""
    if not parts or not parts.get("ttft_ms"):
        return None, {}
    ttft = parts["ttft_ms"]
    decode = parts.get("decode_ms", 0.0)
    kv = min(kv_ms, decode) if kv_ms is not None else None
    ms = {
        "proxy": parts.get("router_ms", 0.0),
        "prefill": parts.get("prefill_ms", 0.0),
        **({"kv_transfer": kv} if kv is not None else {}),
        "decode": decode - (kv or 0.0),
        "client": max(0.0, parts.get("client_ms", 0.0)),
    }
    return ttft, {k: round(v / ttft, 4) for k, v in ms.items()}


def _role_time(r: RoleTiming | None, minus: float = 0.0) -> float | None:
    if r is None or r.queue_ms is None or r.compute_ms is None:
        return None
    return max(0.0, r.queue_ms - minus) + r.compute_ms


def _ratio(now: float | None, base: float | None) -> float | None:
    if now is None or base is None or base <= 0:
        return None
    return round(now / base, 3)


def _growth(roles: dict[str, RoleTiming], kv: float | None, base: Baseline | None) -> dict[str, float]:
    if base is None:
        return {}
    out: dict[str, float | None] = {}
    for role, r in roles.items():
        b = base.roles.get(role)
        if role == "decode" and r.tpot_ms is not None and b is not None and b.tpot_ms:
            out[role] = _ratio(r.tpot_ms, b.tpot_ms)
            kv_base = base.kv_transfer_ms or 0.0
            out[DECODE_WAIT] = _ratio(_role_time(r, kv or 0.0), _role_time(b, kv_base))
        else:
            minus, base_minus = (kv or 0.0, base.kv_transfer_ms or 0.0) if role == "decode" else (0.0, 0.0)
            out[role] = _ratio(_role_time(r, minus), _role_time(b, base_minus))
    return {k: v for k, v in out.items() if v is not None}


def _as_pd(roles: dict[str, RoleTiming]) -> dict[str, RoleTiming]:
    """An aggregated instance does both jobs: its queue and compute (scheduled -> first token) are
    the prefill side, its TPOT the decode side, judged by the same rules."""
    agg = roles.get("aggregated")
    if agg is None or "prefill" in roles or "decode" in roles:
        return roles
    return {
        "prefill": RoleTiming(requests=agg.requests, queue_ms=agg.queue_ms, compute_ms=agg.compute_ms),
        "decode": RoleTiming(requests=agg.requests, tpot_ms=agg.tpot_ms),
    }


def _client(section: dict[str, Any] | None) -> tuple[float | None, float | None, list[str]]:
    if not section:
        return None, None, []
    busy = [float(b) for b in section.get("cpu_busy") or []]
    lag = (section.get("loop_lag_ms") or {}).get("p99")
    return (max(busy) if busy else None), (None if lag is None else float(lag)), list(section.get("warnings") or [])


def judge(
    parts: dict[str, float] | None,
    roles: dict[str, RoleTiming],
    kv_transfer_ms: float | None,
    tpot_ms: float | None,
    client: dict[str, Any] | None,
    baseline: Baseline | None,
    *,
    e2el_ms: float | None,
) -> BottleneckSummary:
    """The verdict of one point. `parts`: the breakdown's per-request means (ms; None without the
    proxy); `roles`: vLLM's histogram means per role; `client`: the result's `client` section;
    `e2el_ms`: the client's mean E2EL (the request's whole time; None: TTFT's parts alone)."""
    ttft, share = shares(parts, kv_transfer_ms)
    judged = _as_pd(roles)
    aggregated = judged is not roles
    base = None if baseline is None else baseline.model_copy(update={"roles": _as_pd(baseline.roles)})
    growth = _growth(judged, kv_transfer_ms, base)
    kv_growth = _ratio(kv_transfer_ms, baseline.kv_transfer_ms if baseline else None)
    busy, lag, warnings = _client(client)
    saturated: list[Resource] = []
    reasons: list[str] = []

    def fired(resource: Resource, why: str) -> None:
        if resource not in saturated:
            saturated.append(resource)
        reasons.append(f"{resource}: {why}")

    if busy is not None and busy >= CLIENT_CPU:
        fired("client", f"a load process at {busy:.0%} CPU (>= {CLIENT_CPU:.0%})")
    if lag is not None and ttft and lag >= MIN_SHARE * ttft:
        fired("client", f"event-loop lag p99 {lag:.1f} ms, {lag / ttft:.0%} of TTFT (>= {MIN_SHARE:.0%})")
    if share.get("client", 0.0) >= CLIENT_SHARE:
        fired("client", f"client part {share['client']:.0%} of TTFT (>= {CLIENT_SHARE:.0%})")
    if share.get("proxy", 0.0) >= ROUTER_SHARE:
        fired("router", f"proxy's own time {share['proxy']:.0%} of TTFT (>= {ROUTER_SHARE:.0%})")
    # Growth is only measured against a baseline, so where there is one this is its concurrency.
    base_c = baseline.concurrency if baseline is not None else 0
    for role in ("prefill", "decode"):
        r = judged.get(role)
        if r is None:
            continue
        queued = r.queue_ms is not None and r.compute_ms and r.queue_ms >= QUEUE_OVER_COMPUTE * r.compute_ms
        if role == "prefill" and queued:
            fired(role, f"queue {r.queue_ms:.1f} ms >= {QUEUE_OVER_COMPUTE:g} x compute {r.compute_ms:.1f} ms (means)")
        g = growth.get(role)
        if g is not None and g >= GROWTH:
            what = "TPOT" if role == "decode" and DECODE_WAIT in growth else "queue + compute"
            fired(role, f"{what} grew {g:.1f}x over C={base_c} (>= {GROWTH:g}x)")
    wait = growth.get(DECODE_WAIT)
    if wait is not None and wait >= GROWTH:
        fired("decode", f"queue + first step less the KV mean grew {wait:.1f}x over C={base_c} (>= {GROWTH:g}x)")
    kv_share = share.get("kv_transfer")
    kv_grew = kv_growth is not None and kv_growth >= GROWTH
    if kv_grew and (kv_share is None or kv_share >= MIN_SHARE):
        shown = "" if kv_share is None else f", {kv_share:.0%} of TTFT"
        fired("transfer", f"KV transfer mean grew {kv_growth:.1f}x over C={base_c}{shown}")

    weights = dict(share)
    if aggregated and share and ttft:
        # The aggregated leg is all "decode" on the proxy's clock: its queue + compute is prefill's.
        p = judged["prefill"]
        before_first = min((p.queue_ms or 0.0) + (p.compute_ms or 0.0), share["decode"] * ttft)
        weights["prefill"] = before_first / ttft
        weights["decode"] = share["decode"] - weights["prefill"]
    if weights and ttft and e2el_ms is not None:
        # Every token after the first is decode's time too: in TTFT's units, a share of it.
        weights["decode"] = weights.get("decode", 0.0) + max(0.0, e2el_ms - ttft) / ttft
    verdict = _verdict(saturated, weights, growth, kv_growth)
    dominant = max(share, key=lambda k: share[k]) if share else None
    return BottleneckSummary(
        verdict=verdict,
        dominant=dominant,
        saturated=saturated,
        reasons=reasons,
        evidence=Evidence(
            ttft_ms=None if ttft is None else round(ttft, 4),
            shares=share,
            roles=roles,
            growth=growth,
            kv_transfer_ms=None if kv_transfer_ms is None else round(kv_transfer_ms, 4),
            kv_growth=kv_growth,
            tpot_ms=tpot_ms,
            e2el_ms=None if e2el_ms is None else round(e2el_ms, 4),
            proxy_ms=None if not parts or "router_ms" not in parts else round(parts["router_ms"], 4),
            client_cpu_busy=busy,
            client_loop_lag_p99_ms=lag,
            client_warnings=warnings,
            baseline_concurrency=None if baseline is None else baseline.concurrency,
        ),
    )


def _verdict(
    saturated: list[Resource], share: dict[str, float], growth: dict[str, float], kv_growth: float | None
) -> Verdict:
    if "client" in saturated:
        return "client-bound"
    if "router" in saturated:
        return "router-bound"
    servers = [r for r in _ORDER if r in saturated]
    if not servers:
        return "not saturated"
    part = {"prefill": "prefill", "transfer": "kv_transfer", "decode": "decode"}
    if share:
        weight = {r: share.get(part[r], 0.0) for r in servers}
    else:
        weight = {r: (kv_growth if r == "transfer" else growth.get(r)) or 0.0 for r in servers}
    best = max(servers, key=lambda r: weight[r])  # ties: the first in _ORDER
    verdicts: dict[Resource, Verdict] = {
        "prefill": "prefill-bound",
        "transfer": "transfer-bound",
        "decode": "decode-bound",
    }
    return verdicts[best]
