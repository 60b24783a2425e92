"""Did a benchmark point measure disaggregated serving? Rules over /metrics deltas.

Each rule reports its measured value and threshold; a rule whose metrics the servers do
not export is "not_checked", never "passed". The verdict: "invalid" when a rule failed;
"unverified" when the evidence that matters could not be had: for a disaggregated point the KV
rule (`kv_transferred`, the one that proves decode loaded the prompt's KV rather than computing
it), for an aggregated one every server-side rule; else "valid". `valid` mirrors it as
true / false / null (null: unverified, so a caller that rejects only `valid is False` keeps
unverified points and one that wants evidence can ask for `true`). Which counters prove a
transfer depends on the connector: harness.validity.kv_evidence.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from harness import kv_connectors
from harness.config.benchmark import ValidityThresholds
from harness.kv_connectors.entry import KvEvidence
from harness.validity.kv_evidence import EXTERNAL_HITS, LOCAL_COMPUTE, evidence_for
from harness.validity.series import Scrape, delta

PROMPT_TOKENS = r"vllm:prompt_tokens(_total)?"
GENERATION_TOKENS = r"vllm:generation_tokens(_total)?"
_NAMES = "|".join(kv_connectors.kv_names())
TRANSFER_BYTES = rf"(vllm:)?\w*({_NAMES}|kv)\w*bytes_transferred(_total|_sum)?"
# Transfer durations on the role that counts them (NIXL's reads on decode, its pushed writes on
# prefill, the bundled connector's pulls on decode): sum and count; each connector's own
# completed-transfer histogram, and names that look like one.
_RECEIVE_HISTS = [
    e.evidence.received.removesuffix("_count")
    for e in kv_connectors.TABLE.values()
    if e.evidence and e.evidence.received and e.evidence.received.endswith("_count")
]
_TRANSFER_HIST = "|".join(
    [rf"(vllm:)?\w*({_NAMES}|kv)\w*xfer_time_seconds", r"(vllm:)?pdbench\w*transfer_seconds", *_RECEIVE_HISTS]
)
TRANSFER_TIME = f"(?:{_TRANSFER_HIST})_sum"
TRANSFER_COUNT = f"(?:{_TRANSFER_HIST})_count"
PREFIX_HITS = r"vllm:prefix_cache_hits(_total)?"
PREEMPTIONS = r"vllm:num_preemptions(_total)?"
GAUGES = {
    "running": r"vllm:num_requests_running",
    "waiting": r"vllm:num_requests_waiting",
    "kv_cache_usage": r"vllm:(gpu_)?kv_cache_usage_perc",
}


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
    # Prompt tokens found in the instance's own prefix cache: on decode, KV it already held
    # (an earlier turn or a shared prefix), so it loaded only the rest from prefill.
    prefix_hits: float | None = None
    recomputed_tokens: float | None = None
    # Completed KV transfers (the connector's own counter): receives where decode pulls, writes
    # on prefill where it pushes (the entry's `counted_on`).
    kv_received: float | None = None
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
CLIENT_RULES = frozenset({"failed_requests", "output_generated", "requests_completed"})


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


def _role_stats(servers: list[ServerScrapes], found: set[str], ev: KvEvidence) -> RoleStats:
    st = RoleStats()
    for s in servers:
        b, a = Scrape.parse(s.before), Scrape.parse(s.after)
        hits = next((d for p, lab in EXTERNAL_HITS if (d := delta(b, a, p, **lab)) is not None), None)
        st.external_hits = _add(st.external_hits, hits, found)
        st.prefix_hits = _add(st.prefix_hits, delta(b, a, PREFIX_HITS), found)
        st.prompt_tokens = _add(st.prompt_tokens, delta(b, a, PROMPT_TOKENS), found)
        st.generation_tokens = _add(st.generation_tokens, delta(b, a, GENERATION_TOKENS), found)
        st.recomputed_tokens = _add(st.recomputed_tokens, delta(b, a, LOCAL_COMPUTE[0], **LOCAL_COMPUTE[1]), found)
        if ev.received:
            st.kv_received = _add(st.kv_received, delta(b, a, ev.received), found)
        st.transfer_bytes = _add(st.transfer_bytes, delta(b, a, TRANSFER_BYTES), found)
        st.transfer_seconds = _add(st.transfer_seconds, delta(b, a, TRANSFER_TIME), found)
        st.transfer_count = _add(st.transfer_count, delta(b, a, TRANSFER_COUNT), found)
        if ev.failures:
            st.transfer_failures = _add(st.transfer_failures, delta(b, a, ev.failures), found)
        if ev.expired:
            st.expired_leases = _add(st.expired_leases, delta(b, a, ev.expired), found)
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
    servers: dict[str, ServerScrapes],
    client: ClientCounts,
    thresholds: ValidityThresholds = ValidityThresholds(),
    connector: str | None = None,
) -> PointValidity:
    """`connector`: the deployment's KV connector (harness.validity.kv_evidence), None when unknown."""
    ev = evidence_for(connector)
    found: dict[str, set[str]] = {}
    roles: dict[str, RoleStats] = {}
    for role in ("prefill", "decode", "aggregated", "proxy"):
        group = [s for s in servers.values() if s.role == role]
        if group:
            found[role] = set()
            roles[role] = _role_stats(group, found[role], ev)
    # An aggregated baseline's servers see every token, as decode does in a PD deployment;
    # there is no KV transfer to check.
    aggregated = "aggregated" in roles and "decode" not in roles
    decode = roles.get("aggregated" if aggregated else "decode", RoleStats())
    counted = roles.get(ev.counted_on, RoleStats())
    rules = [
        _not_applicable("kv_transferred", "aggregated serving: no KV is transferred")
        if aggregated
        else _rule_kv_transferred(decode, counted, client, thresholds, ev),
        _not_applicable("decode_prompt_compute", "aggregated serving computes every prompt")
        if aggregated
        else _rule_decode_prompt_compute(decode, client, thresholds),
        _rule_transfers_clean(roles, ev),
        _rule_failed_share(client, thresholds),
        _rule_output_generated(client),
        _rule_token_counts(decode, client, thresholds),
    ]
    reasons = [f"{r.name}: {r.detail}" for r in rules if r.status == "failed"]
    verdict: Verdict = "invalid" if reasons else "valid"
    server_rules = [r for r in rules if r.name not in CLIENT_RULES]
    if not reasons:
        if not aggregated and _rule(rules, "kv_transferred").status == "not_checked":
            # Without the KV rule nothing shows that decode loaded the prompts rather than
            # computing them: token counts agree just as well for a decode that re-prefilled.
            verdict = "unverified"
            reasons = [f"{r.name}: not checked: {r.detail}" for r in server_rules if r.status == "not_checked"]
        elif all(r.status == "not_checked" for r in server_rules):
            verdict = "unverified"
            reasons = [f"{r.name}: not checked: {r.detail}" for r in server_rules]
    return PointValidity(
        verdict=verdict,
        valid={"valid": True, "invalid": False}.get(verdict),
        reasons=reasons,
        rules=rules,
        roles=roles,
        metrics_found={k: sorted(v) for k, v in found.items()},
    )


def _rule(rules: list[RuleResult], name: str) -> RuleResult:
    return next(r for r in rules if r.name == name)


def _not_applicable(name: str, why: str) -> RuleResult:
    return RuleResult(name=name, status="not_checked", threshold=0, detail=why)


def _completed(ev: KvEvidence) -> str:
    """What the connector's completed-transfer counter counts, as the rule says it."""
    return "KV write(s)" if ev.counted_on == "prefill" else "KV receive(s)"


def _rule_kv_transferred(
    decode: RoleStats, counted: RoleStats, client: ClientCounts, t: ValidityThresholds, ev: KvEvidence
) -> RuleResult:
    """Decode loaded the prompts from remote KV: vLLM's scheduler counted them as external hits
    and, where the connector exports it, its own counter saw a completed transfer per request, on
    the role that counts them (`counted`: the entry's `counted_on`, decode's receives for a pull,
    prefill's writes for a push; the other role's zero is no failure). Tokens decode found in its
    own prefix cache count too: the connector loads only the tokens beyond them (NIXL: remote
    count minus local hits), so a later turn of a session or a shared prefix that decode already
    holds is not computed there either."""
    name, need = "kv_transferred", 1 - t.hit_tolerance
    if decode.external_hits is None:
        return RuleResult(
            name=name, status="not_checked", threshold=need, detail="decode exports no external prefix-cache metric"
        )
    if client.prompt_tokens <= 0:
        return RuleResult(name=name, status="not_checked", threshold=need, detail="no prompt tokens were sent")
    local = decode.prefix_hits or 0.0
    share = (decode.external_hits + local) / client.prompt_tokens
    held = f" and found {local:.0f} in its own prefix cache" if local else ""
    loaded = (
        f"decode loaded {decode.external_hits:.0f} of {client.prompt_tokens} prompt tokens "
        f"from remote KV{held} ({share:.1%}; need >= {need:.0%})"
    )

    def result(status: Literal["passed", "failed", "not_checked"], detail: str) -> RuleResult:
        return RuleResult(name=name, status=status, measured=share, threshold=need, detail=f"{loaded}{detail}")

    if share < need:
        return result("failed", f"; {decode.recomputed_tokens or 0:.0f} recomputed on decode")
    if ev.received is None:
        return result(
            "passed",
            f", as counted by vLLM's scheduler at admission; {ev.missing}, so a completed load is not shown "
            "(a failed one fails its request under vLLM's default kv_load_failure_policy)",
        )
    side, what = ev.counted_on, _completed(ev)
    if counted.kv_received is None:
        return result(
            "not_checked",
            f", but {side} exports no counter of completed {what} ({ev.received}), "
            f"which vLLM's {ev.connector} connector exports there",
        )
    if counted.kv_received < client.completed:
        return result(
            "failed",
            f", but {side} completed {counted.kv_received:.0f} {what} for {client.completed} completed request(s)",
        )
    return result("passed", f"; {side} completed {counted.kv_received:.0f} {what} for {client.completed} request(s)")


def _rule_decode_prompt_compute(decode: RoleStats, client: ClientCounts, t: ValidityThresholds) -> RuleResult:
    """Decode's own prompt compute (vLLM's local_compute source) against the prompt tokens sent."""
    name = "decode_prompt_compute"
    if decode.recomputed_tokens is None:
        return RuleResult(
            name=name,
            status="not_checked",
            threshold=t.hit_tolerance,
            detail="decode exports no prompt_tokens_by_source{source=local_compute}",
        )
    if client.prompt_tokens <= 0:
        return RuleResult(name=name, status="not_checked", threshold=t.hit_tolerance, detail="no prompt tokens sent")
    share = decode.recomputed_tokens / client.prompt_tokens
    return RuleResult(
        name=name,
        status="passed" if share <= t.hit_tolerance else "failed",
        measured=share,
        threshold=t.hit_tolerance,
        detail=f"decode computed {decode.recomputed_tokens:.0f} of {client.prompt_tokens} prompt tokens itself "
        f"({share:.1%}; at most {t.hit_tolerance:.0%})",
    )


def _rule_transfers_clean(roles: dict[str, RoleStats], ev: KvEvidence) -> RuleResult:
    name = "no_failed_or_expired_transfers"
    failures = [r.transfer_failures for r in roles.values() if r.transfer_failures is not None]
    expired = [r.expired_leases for r in roles.values() if r.expired_leases is not None]
    if not failures and not expired:
        why = ev.missing if ev.failures is None and ev.expired is None else "no server exports them"
        return RuleResult(
            name=name,
            status="not_checked",
            threshold=0,
            detail=f"KV transfer failure or lease-expiry metrics: {why}",
        )
    bad = sum(failures) + sum(expired)
    return RuleResult(
        name=name,
        status="passed" if bad == 0 else "failed",
        measured=bad,
        threshold=0,
        detail=f"{sum(failures):.0f} failed transfer(s), {sum(expired):.0f} expired KV lease(s)",
    )


def _rule_output_generated(client: ClientCounts) -> RuleResult:
    """ "Succeeded with nothing": requests that completed without a single output token."""
    ok = client.completed == 0 or client.output_tokens > 0
    return RuleResult(
        name="output_generated",
        status="passed" if ok else "failed",
        measured=client.output_tokens,
        threshold=1,
        detail=f"{client.output_tokens} output tokens over {client.completed} completed request(s)",
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


def early_reason(
    servers: dict[str, ServerScrapes], completed: int, thresholds: ValidityThresholds, connector: str | None = None
) -> str | None:
    """Why a running point is already invalid, from each server's scrape at its start (`before`) and
    now (`after`); None when nothing is shown yet. Server counts are their own denominators, so
    nothing about requests still in flight is assumed. `completed`: requests that succeeded so far."""
    ev = evidence_for(connector)
    found: set[str] = set()
    roles = {
        role: _role_stats(group, found, ev)
        for role in ("prefill", "decode")
        if (group := [s for s in servers.values() if s.role == role])
    }
    bad = sum((r.transfer_failures or 0) + (r.expired_leases or 0) for r in roles.values())
    if bad:
        return f"{bad:.0f} failed or expired KV transfer(s)"
    decode = roles.get("decode")
    if decode is None:
        return None
    if decode.recomputed_tokens is not None and decode.prompt_tokens:
        share = decode.recomputed_tokens / decode.prompt_tokens
        if share > thresholds.hit_tolerance:
            return (
                f"decode computed {decode.recomputed_tokens:.0f} of its {decode.prompt_tokens:.0f} prompt tokens "
                f"itself ({share:.0%}): the KV was not transferred"
            )
    if completed > 0 and decode.generation_tokens == 0:
        return f"{completed} request(s) completed and decode generated no token"
    return None


def receives_behind(v: PointValidity, client: ClientCounts, connector: str | None = None) -> bool:
    """The role that counts the connector's transfers (its entry's `counted_on`) has counted fewer
    completed ones than requests completed (so far)."""
    counted = v.roles.get(evidence_for(connector).counted_on)
    return counted is not None and counted.kv_received is not None and counted.kv_received < client.completed


def stopped_early(v: PointValidity, reason: str, after_s: float) -> PointValidity:
    """The verdict of a point stopped at `after_s` because early_reason gave `reason`: invalid,
    with that reason first, whatever the (partial) point's own rules found."""
    rule = RuleResult(
        name="early_evidence",
        status="failed",
        measured=after_s,
        detail=f"point stopped after {after_s:.0f} s: {reason}",
    )
    return v.model_copy(
        update={
            "verdict": "invalid",
            "valid": False,
            # An unverified point's reasons say what was not checked: no failure to keep beside this one.
            "reasons": [f"{rule.name}: {rule.detail}", *(v.reasons if v.verdict == "invalid" else [])],
            "rules": [rule, *v.rules],
        }
    )
