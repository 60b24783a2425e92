"""The rule `kv_transport`: did the KV move at a rate its path allows, or did the transport fall
back (UCX without a GPU transport, a descriptor per block) while every token still arrived?

A point's achieved KV rate (its `kv_handoff` section: bytes over transfer time summed, over the
transfers of at least `validity.kv_judged_min_bytes`) against the ceiling measured in the same
job before the sweep (state/kv_ceiling.json, harness.rundir.kv_ceiling):
- below `validity.kv_min_ceiling_share` of it: failed, `degraded_transport`, the point invalid;
- above the fastest copy the ceiling measured, or across hosts the NIC's line rate (with
  OVER_CEILING's slack): a metric error, the rate cannot be what moved the bytes; not checked,
  and flagged;
- no section, no ceiling, or no transfer large enough: not checked, saying which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from harness import kv_connectors
from harness.config.benchmark import ValidityThresholds
from harness.rundir.kv_ceiling import KvCeiling
from harness.rundir.kv_handoff_summary import KvHandoffSummary
from harness.rundir.paths import KV_CEILING, STATE
from harness.validity.kv_handoff import from_nixl_scrapes
from harness.validity.rules import PointValidity, RuleResult
from harness.validity.ucx_lanes import is_emulated

RULE = "kv_transport"
Status = Literal["passed", "failed", "not_checked"]
# The ceiling is the median of a few copies; a transfer a little faster than the best of them is
# noise, one well above it a timing that left part of the transfer out (sglang #31877).
OVER_CEILING = 1.10


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def judge(
    h: KvHandoffSummary | None, ceiling: KvCeiling | None, t: ValidityThresholds, connector: str | None
) -> tuple[RuleResult, KvHandoffSummary | None]:
    """The rule, and the section with the ceiling, the share and the flag added."""
    need = t.kv_min_ceiling_share

    def rule(status: Status, detail: str, measured: float | None = None) -> RuleResult:
        return RuleResult(name=RULE, status=status, measured=measured, threshold=need, detail=detail)

    if h is None:
        return rule("not_checked", f"the {connector} connector reported no KV transfer sizes and times"), None
    if ceiling is None:
        why = f"no ceiling was measured ({STATE}/{KV_CEILING} is written by a pdbench job's node)"
    else:
        why = ceiling.describe()
    h = h.model_copy(update={"ceiling": why, "ceiling_gbps": ceiling.gbps if ceiling is not None else None})
    if not need:
        return rule("not_checked", "validity.kv_min_ceiling_share is 0: not judged"), h
    if ceiling is None or ceiling.gbps is None:
        return rule("not_checked", why), h
    if not h.judged_transfers or h.judged_gbps is None:
        mean = "" if h.bytes_per_transfer is None else f" ({_mib(h.bytes_per_transfer)} on average)"
        return rule(
            "not_checked",
            f"none of the {h.transfers} KV transfer(s){mean} counts: under "
            f"validity.kv_judged_min_bytes ({_mib(h.judged_min_bytes or 0)}) a transfer's time is the "
            "connector's fixed cost per transfer, not its lane's rate",
        ), h
    rate = h.judged_gbps
    best = ceiling.best_gbps or ceiling.gbps
    if rate > best * OVER_CEILING:
        what = (
            f"lane {h.lane or 'not proven'}: {h.judged_transfers} transfer(s) of at least "
            f"{_mib(h.judged_min_bytes or 0)} moved at {rate:.2f} GB/s"
        )
        return rule(
            "not_checked",
            f"metric_error: {what}, above {ceiling.best_what} ({best:.1f} GB/s): the connector's "
            "timing leaves part of the transfer out",
            rate / ceiling.gbps,
        ), h.model_copy(update={"share": rate / ceiling.gbps, "flag": "metric_error"})
    effective, fixed_ms = beyond_fixed_cost(h, t.kv_fixed_cost_ms)
    moved = (
        f"lane {h.lane or 'not proven'}: {h.judged_transfers} transfer(s) of at least {_mib(h.judged_min_bytes or 0)} "
        f"moved at {rate:.2f} GB/s"
    )
    if effective is None:  # each transfer took no longer than the fixed cost allowed: not slow
        h = h.model_copy(update={"fixed_cost_ms": fixed_ms})
        return rule("passed", f"{moved}, within the fixed cost of {fixed_ms:g} ms a transfer", None), h
    share = effective / ceiling.gbps
    h = h.model_copy(update={"share": share, "fixed_cost_ms": fixed_ms, "beyond_fixed_gbps": effective})
    beyond = "" if not fixed_ms else f" ({effective:.2f} GB/s beyond {fixed_ms:g} ms a transfer)"
    what = f"{moved}{beyond}, {percent(share)} of the ceiling {ceiling.describe()}"
    if share < need:
        evidence = kv_connectors.get_kv(connector).evidence if connector else None
        causes = evidence.slow_causes if evidence is not None else "a wrong NIC or transport for the path"
        return rule(
            "failed",
            f"degraded_transport: {what}, below {need:.0%}{lane_finding(h)}{split_finding(h)}; usual causes: {causes}",
            share,
        ), h.model_copy(update={"flag": "degraded_transport"})
    return rule("passed", f"{what} (at least {need:.0%})", share), h


def percent(share: float) -> str:
    """A share as a percentage that stays readable far below 1 % (0.012%, not 0.0%)."""
    return f"{share:.1%}" if share >= 0.001 else f"{share * 100:.2g}%"


def beyond_fixed_cost(h: KvHandoffSummary, fixed_cost_ms: float) -> tuple[float | None, float]:
    """The judged transfers' rate over their time less `fixed_cost_ms` each (None when the fixed
    cost covers it all), and the fixed cost applied. A transfer's time is a fixed cost (vLLM's NIXL
    path: 9-14 ms on H200s, docs/validity.md) plus its bytes over the lane's rate: judging the
    plain rate would call a healthy 512 MiB transfer degraded and let no threshold separate it
    from a fallback."""
    assert h.judged_gbps is not None and h.judged_transfers
    nbytes = h.judged_bytes if h.judged_bytes is not None else (h.bytes_per_transfer or 0) * h.judged_transfers
    seconds = nbytes / (h.judged_gbps * 1e9)
    moving = seconds - h.judged_transfers * fixed_cost_ms / 1e3
    return (nbytes / (moving * 1e9) if moving > 0 else None), fixed_cost_ms


# NIXL posts one descriptor per block and layer when nothing merges: 32 KiB for an 8B Llama at
# block size 16; merged ones are MiBs. The report's finding uses the same bound.
SPLIT_BYTES = 64 << 10


def lane_finding(h: KvHandoffSummary) -> str:
    """What the lane says when UCX moved the KV by software emulation (harness.validity.ucx_lanes):
    a read where decode pulls, a write where prefill pushes (the entry's `counted_on`)."""
    if not is_emulated(h.lane):
        return ""
    ev = kv_connectors.get_kv(h.connector).evidence if h.connector in kv_connectors.kv_names() else None
    did, do = ("wrote", "write") if ev is not None and ev.counted_on == "prefill" else ("read", "read")
    return (
        f"; measured: UCX {did} the KV by software emulation (messages over the lane named): none of the "
        f"transports it was given can {do} that memory directly"
    )


def split_finding(h: KvHandoffSummary) -> str:
    """What the descriptors say when NIXL split each transfer into one per block and layer."""
    if h.bytes_per_descriptor is None or h.bytes_per_descriptor > SPLIT_BYTES:
        return ""
    return (
        f"; measured: {h.descriptors_per_transfer:,.0f} descriptors a transfer of {h.bytes_per_descriptor / 1024:.0f} "
        "KiB each, one per block and layer (nothing merged: the block pool wrapped, or the block size is small; "
        "a larger --block-size makes 4x fewer at 64)"
    )


def with_kv_transport(verdict: PointValidity, r: RuleResult) -> PointValidity:
    """The point's verdict with kv_transport added: a failure makes it invalid (its reason first);
    otherwise the verdict stands. When the early check already stopped the point for this very
    finding, its reason says it: the rule is added, its several-hundred-character reason not again."""
    said = any(x.startswith("early_evidence: ") and x.endswith(r.detail) for x in verdict.reasons)
    if r.status != "failed" or (said and verdict.verdict == "invalid"):
        return verdict.model_copy(update={"rules": [*verdict.rules, r]})
    return verdict.model_copy(
        update={
            "verdict": "invalid",
            "valid": False,
            "reasons": [f"{r.name}: {r.detail}", *(verdict.reasons if verdict.verdict == "invalid" else [])],
            "rules": [*verdict.rules, r],
        }
    )


def early_reason(
    counting: Sequence[tuple[str, str]],
    ceiling: KvCeiling | None,
    t: ValidityThresholds,
    lane: str | None = None,
    connector: str = "nixl",
) -> str | None:
    """Why a running NIXL point is already degraded, from /metrics at its start and now of the
    servers that count the transfers (`counting`: the entry's `counted_on`, decode for the pull,
    prefill for the push; NIXL's histograms count each completed transfer as it ends) and the lane
    UCX selected (harness.validity.ucx_lanes); None when not (yet) shown."""
    if ceiling is None or ceiling.gbps is None or not t.kv_min_ceiling_share:
        return None
    h = from_nixl_scrapes(counting, t.kv_judged_min_bytes, lane, connector=connector)
    r, _ = judge(h, ceiling, t, connector)
    return r.detail if r.status == "failed" else None
