"""A result's `bottleneck` section: which part of TTFT dominates a point and which resource is
saturated, with the numbers the verdict used (the rules: harness.validity.bottleneck).

Written by the bench client, read by report; this model is the one definition of the format, so
a reader's error names the field. `RoleTiming` is also the shape of the TTFT breakdown's
`server_means`: means over the point of vLLM's own per-request histograms, not per request.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt

Verdict = Literal["prefill-bound", "decode-bound", "transfer-bound", "router-bound", "client-bound", "not saturated"]
Resource = Literal["prefill", "decode", "transfer", "router", "client"]


class RoleTiming(BaseModel):
    """One role's means over the point, from its servers' histogram deltas (all instances summed).
    On decode, vLLM counts the wait for the remote KV as queue time (the request is not scheduled
    until its KV has landed), and `compute_ms` is its first step: scheduled -> first token."""

    model_config = ConfigDict(frozen=True)
    requests: NonNegativeInt  # requests the role's histograms counted over the point
    queue_ms: NonNegativeFloat | None = None  # vllm:request_queue_time_seconds: arrival -> scheduled
    compute_ms: NonNegativeFloat | None = None  # vllm:request_prefill_time_seconds: scheduled -> first token
    tpot_ms: NonNegativeFloat | None = None  # vllm:request_time_per_output_token_seconds


class Baseline(BaseModel):
    """The sweep's lowest-concurrency point measured before this one (same shape): growth is
    measured against it."""

    model_config = ConfigDict(frozen=True)
    concurrency: NonNegativeInt
    roles: dict[str, RoleTiming] = {}
    kv_transfer_ms: NonNegativeFloat | None = None


class Evidence(BaseModel):
    model_config = ConfigDict(frozen=True)
    ttft_ms: NonNegativeFloat | None = None  # mean over the requests the proxy recorded
    # Per request parts' means as shares of the mean TTFT: proxy, prefill, kv_transfer (the decode
    # servers' point mean), decode (the decode leg less that mean), client. Empty without the proxy.
    shares: dict[str, float] = {}
    roles: dict[str, RoleTiming] = {}  # point means of vLLM's histograms, per role
    # Per role: this point's queue + compute (decode: TPOT where exported) over the baseline's; an
    # aggregated instance's queue + compute under "prefill", its TPOT under "decode".
    growth: dict[str, float] = {}
    kv_transfer_ms: NonNegativeFloat | None = None  # the connector's mean per transfer (its counting servers')
    kv_growth: float | None = None
    tpot_ms: NonNegativeFloat | None = None  # the client's mean TPOT
    e2el_ms: NonNegativeFloat | None = None  # the client's mean E2EL: the request's whole time
    proxy_ms: NonNegativeFloat | None = None  # the proxy's own time, mean per request
    client_cpu_busy: NonNegativeFloat | None = None  # the busiest load process's CPU share
    client_loop_lag_p99_ms: NonNegativeFloat | None = None
    client_warnings: list[str] = []
    baseline_concurrency: NonNegativeInt | None = None


class BottleneckSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    verdict: Verdict
    dominant: str | None  # the part of TTFT with the largest share; None without the proxy's parts
    saturated: list[Resource]  # every resource a rule found saturated, in the order the rules run
    reasons: list[str]  # each rule that fired, with its numbers and threshold
    evidence: Evidence
