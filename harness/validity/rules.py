"""Did a benchmark point measure disaggregated serving? Rules over /metrics deltas.

Each rule reports its measured value and threshold; a rule whose metrics the servers do
not export is "not_checked", never "passed". The verdict: "invalid" when a rule failed;
"unverified" when no server-side rule could be checked (no /metrics reachable, or none of
the families exported): a point with no evidence is not valid; else "valid".
`valid` mirrors it as true / false / null (null: unverified, so a caller that rejects only
`valid is False` keeps unverified points and one that wants evidence can ask for `true`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from harness.validity.metrics import Scrape, delta

# Family-name patterns (full match). Alternatives cover vLLM versions and connectors.
EXTERNAL_HITS = [
    (r"vllm:external_prefix_cache_hits(_total)?", {}),
    (r"vllm:prompt_tokens_cached_by_source(_total)?", {"source": "p2p"}),
]
PROMPT_TOKENS = r"vllm:prompt_tokens(_total)?"
GENERATION_TOKENS = r"vllm:generation_tokens(_total)?"
RECOMPUTED = (r"vllm:prompt_tokens_by_source(_total)?", {"source": "local_compute"})
TRANSFER_FAILURES = (
    r"(vllm:)?\w*(nixl|moriio|mooncake|pdbench|kv_transfer|kv_connector)\w*(failed|failure|error)\w*_total"
)
EXPIRED_LEASES = r"(vllm:)?\w*(nixl|moriio|mooncake|pdbench|kv)\w*(expired|after_expiry)\w*_total"
TRANSFER_BYTES = r"(vllm:)?\w*(nixl|moriio|mooncake|pdbench|kv)\w*bytes_transferred(_total|_sum)?"
# Decode-side transfer durations (NIXL's reads, the bundled connector's pulls): sum and count.
_TRANSFER_HIST = (
    r"(vllm:)?\w*(nixl|moriio|mooncake|pdbench|kv)\w*xfer_time_seconds|(vllm:)?pdbench\w*transfer_seconds"
    r"|vllm:pdbench_kv_recv_seconds"
)
TRANSFER_TIME = f"(?:{_TRANSFER_HIST})_sum"
TRANSFER_COUNT = f"(?:{_TRANSFER_HIST})_count"
PREEMPTIONS = r"vllm:num_preemptions(_total)?"
GAUGES = {
    "running": r"vllm:num_requests_running",
    "waiting": r"vllm:num_requests_waiting",
    "kv_cache_usage": r"vllm:(gpu_)?kv_cache_usage_perc",
}


class ValidityThresholds(BaseModel):
    hit_tolerance: float = Field(0.02, ge=0, le=1, description="share of sent prompt tokens that may miss")
    max_failed_share: float = Field(0.05, ge=0, le=1, description="InferenceX CI's 5 %")
    token_tolerance: float = Field(0.02, ge=0, le=1, description="client vs server token counts")


class RuleResult(BaseModel):
    name: str
    status: Literal["passed", "failed", "not_checked"]
    measured: float | None = None
    threshold: float | None = None
    detail: str


class RoleStats(BaseModel):
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    external_hits: float | None = None
    recomputed_tokens: float | None = None
    transfer_bytes: float | None = None
    transfer_seconds: float | None = None
    transfer_count: float | None = None
    transfer_failures: float | None = None
    expired_leases: float | None = None
    preemptions: float | None = None
    peak_running: float | None = None
    peak_waiting: float | None = None
    peak_kv_cache_usage: float | None = None


Verdict = Literal["valid", "invalid", "unverified"]
# Rules judged from the client's own counts; they are no evidence about the servers.
CLIENT_RULES = frozenset({"failed_requests"})


class PointValidity(BaseModel):
    verdict: Verdict
    valid: bool | None  # True / False / None for valid / invalid / unverified
    reasons: list[str]  # why the verdict is not "valid": failed rules, or what could not be checked
    rules: list[RuleResult]
    roles: dict[str, RoleStats]
    metrics_found: dict[str, list[str]]


class ServerScrapes(BaseModel):
    """One server's scrapes around a point (texts), and what gauge samples taken during it showed:
    `peaks` (folded as each sample arrives, so a long point keeps no texts) and/or raw `during` texts."""

    model_config = {"arbitrary_types_allowed": True}
    role: Literal["prefill", "decode", "aggregated", "proxy"]
    before: str
    after: str
    during: list[str] = []
    peaks: dict[str, float] = {}


def gauge_peaks(text: str, peaks: dict[str, float] | None = None) -> dict[str, float]:
    """Fold one scrape's gauges (GAUGES keys, summed over engines) into running maxima."""
    out = dict(peaks or {})
    scrape = Scrape.parse(text)
    for key, pattern in GAUGES.items():
        t = scrape.total(pattern)
        if t is not None:
            out[key] = max(out.get(key, t[0]), t[0])
    return out


class ClientCounts(BaseModel):
    prompt_tokens: int  # prompt tokens of every measured request sent
    output_tokens: int
    completed: int
    failed: int


def _add(acc: float | None, value: tuple[float, list[str]] | None, found: set[str]) -> float | None:
    if value is None:
        return acc
    found.update(value[1])
    return (acc or 0.0) + value[0]


def _role_stats(servers: list[ServerScrapes], found: set[str]) -> RoleStats:
    st = RoleStats()
    for s in servers:
        b, a = Scrape.parse(s.before), Scrape.parse(s.after)
        hits = next((d for p, lab in EXTERNAL_HITS if (d := delta(b, a, p, **lab)) is not None), None)
        st.external_hits = _add(st.external_hits, hits, found)
        st.prompt_tokens = _add(st.prompt_tokens, delta(b, a, PROMPT_TOKENS), found)
        st.generation_tokens = _add(st.generation_tokens, delta(b, a, GENERATION_TOKENS), found)
        st.recomputed_tokens = _add(st.recomputed_tokens, delta(b, a, RECOMPUTED[0], **RECOMPUTED[1]), found)
        st.transfer_bytes = _add(st.transfer_bytes, delta(b, a, TRANSFER_BYTES), found)
        st.transfer_seconds = _add(st.transfer_seconds, delta(b, a, TRANSFER_TIME), found)
        st.transfer_count = _add(st.transfer_count, delta(b, a, TRANSFER_COUNT), found)
        st.transfer_failures = _add(st.transfer_failures, delta(b, a, TRANSFER_FAILURES), found)
        st.expired_leases = _add(st.expired_leases, delta(b, a, EXPIRED_LEASES), found)
        st.preemptions = _add(st.preemptions, delta(b, a, PREEMPTIONS), found)
        peaks = s.peaks
        for text in [s.before, *s.during, s.after]:
            peaks = gauge_peaks(text, peaks)
        for key, value in peaks.items():
            attr = f"peak_{key}"
            setattr(st, attr, max(getattr(st, attr) or 0.0, value))
    return st


def unverified(reason: str) -> PointValidity:
    """The verdict of a point with no server evidence at all (e.g. no scrape targets given)."""
    return PointValidity(verdict="unverified", valid=None, reasons=[reason], rules=[], roles={}, metrics_found={})


def evaluate(
    servers: dict[str, ServerScrapes], client: ClientCounts, thresholds: ValidityThresholds = ValidityThresholds()
) -> PointValidity:
    found: dict[str, set[str]] = {}
    roles: dict[str, RoleStats] = {}
    for role in ("prefill", "decode", "aggregated", "proxy"):
        group = [s for s in servers.values() if s.role == role]
        if group:
            found[role] = set()
            roles[role] = _role_stats(group, found[role])
    # An aggregated baseline's servers see every token, as decode does in a PD deployment;
    # there is no KV transfer to check.
    aggregated = "aggregated" in roles and "decode" not in roles
    decode = roles.get("aggregated" if aggregated else "decode", RoleStats())
    rules = [
        _not_applicable("kv_transferred", "aggregated serving: no KV is transferred")
        if aggregated
        else _rule_kv_transferred(decode, client, thresholds),
        _rule_transfers_clean(roles),
        _rule_failed_share(client, thresholds),
        _rule_token_counts(decode, client, thresholds),
    ]
    reasons = [f"{r.name}: {r.detail}" for r in rules if r.status == "failed"]
    verdict: Verdict = "invalid" if reasons else "valid"
    if not reasons and all(r.status == "not_checked" for r in rules if r.name not in CLIENT_RULES):
        verdict = "unverified"
        reasons = [f"{r.name}: not checked: {r.detail}" for r in rules if r.name not in CLIENT_RULES]
    return PointValidity(
        verdict=verdict,
        valid={"valid": True, "invalid": False}.get(verdict),
        reasons=reasons,
        rules=rules,
        roles=roles,
        metrics_found={k: sorted(v) for k, v in found.items()},
    )


def _not_applicable(name: str, why: str) -> RuleResult:
    return RuleResult(name=name, status="not_checked", threshold=0, detail=why)


def _rule_kv_transferred(decode: RoleStats, client: ClientCounts, t: ValidityThresholds) -> RuleResult:
    name, need = "kv_transferred", 1 - t.hit_tolerance
    if decode.external_hits is None:
        return RuleResult(
            name=name, status="not_checked", threshold=need, detail="decode exports no external prefix-cache metric"
        )
    if client.prompt_tokens <= 0:
        return RuleResult(name=name, status="not_checked", threshold=need, detail="no prompt tokens were sent")
    share = decode.external_hits / client.prompt_tokens
    ok = share >= need
    return RuleResult(
        name=name,
        status="passed" if ok else "failed",
        measured=share,
        threshold=need,
        detail=f"decode loaded {decode.external_hits:.0f} of {client.prompt_tokens} prompt tokens "
        f"from remote KV ({share:.1%}; need >= {need:.0%})"
        + ("" if ok else f"; {decode.recomputed_tokens or 0:.0f} recomputed on decode"),
    )


def _rule_transfers_clean(roles: dict[str, RoleStats]) -> RuleResult:
    name = "no_failed_or_expired_transfers"
    failures = [r.transfer_failures for r in roles.values() if r.transfer_failures is not None]
    expired = [r.expired_leases for r in roles.values() if r.expired_leases is not None]
    if not failures and not expired:
        return RuleResult(
            name=name,
            status="not_checked",
            threshold=0,
            detail="no server exports KV transfer failure or lease-expiry metrics",
        )
    bad = sum(failures) + sum(expired)
    return RuleResult(
        name=name,
        status="passed" if bad == 0 else "failed",
        measured=bad,
        threshold=0,
        detail=f"{sum(failures):.0f} failed transfer(s), {sum(expired):.0f} expired KV lease(s)",
    )


def _rule_failed_share(client: ClientCounts, t: ValidityThresholds) -> RuleResult:
    total = client.completed + client.failed
    share = client.failed / total if total else 1.0
    return RuleResult(
        name="failed_requests",
        status="passed" if share <= t.max_failed_share else "failed",
        measured=share,
        threshold=t.max_failed_share,
        detail=f"{client.failed} of {total} requests failed ({share:.1%}; at most {t.max_failed_share:.0%})",
    )


def _rule_token_counts(decode: RoleStats, client: ClientCounts, t: ValidityThresholds) -> RuleResult:
    name = "token_counts_agree"
    if decode.prompt_tokens is None or decode.generation_tokens is None:
        return RuleResult(
            name=name,
            status="not_checked",
            threshold=t.token_tolerance,
            detail="decode exports no prompt/generation token counters",
        )
    errs = []
    for what, server, mine in (
        ("prompt", decode.prompt_tokens, client.prompt_tokens),
        ("output", decode.generation_tokens, client.output_tokens),
    ):
        errs.append((abs(server - mine) / max(mine, 1), what, server, mine))
    worst = max(errs)
    ok = worst[0] <= t.token_tolerance
    return RuleResult(
        name=name,
        status="passed" if ok else "failed",
        measured=worst[0],
        threshold=t.token_tolerance,
        detail="; ".join(f"{w} tokens: client {m}, decode {s:.0f}" for _, w, s, m in errs),
    )
