"""A result's `kv_handoff` section: how the point's KV moved from prefill to decode, from what
the connector itself reports (the rules that read it: harness.validity.kv_handoff).

Written by the bench client, read by report; this model is the one definition of the format, so
a reader's error names the field. Rates are GB/s (1e9 bytes per second) of the transfer alone:
the bundled connector's pull less its wait for prefill's answer, NIXL's `xfer_time` (post ->
done, vLLM's own clock on decode).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt

Source = Literal["connector_records", "vllm_metrics"]


class Spread(BaseModel):
    """A distribution over the point's transfers: exact where the connector records each one,
    else interpolated in histogram buckets as Prometheus's histogram_quantile does (`min`/`max`
    then unknown; the section's `note` says which). For rates, `p99` is the slow tail: the rate of
    the p99 transfer time, which 99 % of the transfers reached; `min` the slowest transfer's."""

    model_config = ConfigDict(frozen=True)
    p50: NonNegativeFloat
    p99: NonNegativeFloat
    min: NonNegativeFloat | None = None
    max: NonNegativeFloat | None = None


class KvHandoffSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    connector: str
    source: Source
    transfers: NonNegativeInt  # completed transfers over the point (decode's count)
    bytes_total: NonNegativeFloat | None = None
    bytes_per_transfer: NonNegativeFloat | None = None  # mean
    # NIXL: descriptors per transfer and bytes per descriptor (means). A transfer split into one
    # descriptor per block and region (bytes per descriptor = one block of one layer's K or V) is
    # posted piece by piece: vLLM 0.20 with NIXL 1.0.1 after its block pool wrapped, 4 GiB in
    # 131,072 descriptors at 8 GB/s where 77 descriptors ran at 280 (docs/gpu.md).
    descriptors_per_transfer: NonNegativeFloat | None = None
    bytes_per_descriptor: NonNegativeFloat | None = None
    transfer_ms: Spread | None = None
    gbps: Spread | None = None  # per transfer; `min` is the slowest transfer's rate
    gbps_mean: NonNegativeFloat | None = None  # bytes over transfer time, summed over the point
    post_share: NonNegativeFloat | None = None  # NIXL: time to post over transfer time (both sums)
    # The lane that carried the bytes, as the connector proved it ("ipc", "tcp", a mix: "ipc+tcp");
    # None when the connector does not say (`lane_note` then says why).
    lane: str | None = None
    lane_note: str = ""
    note: str = ""  # how the figures were had, and what this connector cannot give
    # What the rule kv_transport judged (harness.validity.kv_transport): the transfers of at least
    # `judged_min_bytes` (NIXL: all of them when their mean is; its histograms pair no size with a
    # time) and their rate, bytes over time summed; against the ceiling measured in the same job
    # (harness.rundir.kv_ceiling). `flag`: degraded_transport (below the share: the point is
    # invalid) or metric_error (above the ceiling: the rate cannot be what moved the bytes).
    judged_min_bytes: NonNegativeInt | None = None
    judged_transfers: NonNegativeInt | None = None
    judged_bytes: NonNegativeFloat | None = None
    judged_gbps: NonNegativeFloat | None = None
    # The time per transfer the rule allowed the connector beyond moving its bytes
    # (validity.kv_fixed_cost_ms), and the rate of the rest: what `share` is of the ceiling.
    fixed_cost_ms: NonNegativeFloat | None = None
    beyond_fixed_gbps: NonNegativeFloat | None = None
    ceiling_gbps: NonNegativeFloat | None = None
    ceiling: str = ""  # how the ceiling was measured, or why there is none
    share: NonNegativeFloat | None = None  # beyond_fixed_gbps over ceiling_gbps
    flag: Literal["degraded_transport", "metric_error"] | None = None
