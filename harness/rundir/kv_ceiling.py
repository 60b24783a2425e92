"""The same-job KV ceiling (state/kv_ceiling.json): the rate the KV's path could have at most,
measured before the sweep (harness.node.kv_ceiling), read by the bench client to judge each
point's achieved KV rate against it (harness.validity.kv_transport).

On one host it is a copy between prefill's and decode's devices. Across hosts (`tcp_stream`) it
is the lower of the NIC's line rate (sysfs, when it has one) and a TCP transfer measured between
prefill-0's and decode-0's nodes; a rate above the line rate is impossible, so the line rate (or,
without one, the fastest transfer) is what a reported rate may not exceed. Records written before
the cross-host fields read as they did.

This model is the one definition of the format. A ceiling that could not be had is recorded too
(`status: missing` with its reason), so a point without a verdict says why.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt, ValidationError

Method = Literal["cuda_peer_copy", "cuda_device_copy", "host_memcpy", "tcp_stream"]


class KvCeiling(BaseModel):
    model_config = ConfigDict(frozen=True)
    status: Literal["measured", "missing"]
    reason: str = ""  # why missing, or what was measured instead of what was asked
    method: Method | None = None
    src_device: str | None = None  # prefill's side, e.g. "cuda:1 NVIDIA H200", "node 0 10.0.0.1"
    dst_device: str | None = None  # decode's side
    # tcp_stream: the interface the transfer left prefill-0's node by, and its line rate (GB/s)
    # from sysfs, or none with what sysfs said instead (line_rate_note)
    interface: str | None = None
    line_rate_gbps: NonNegativeFloat | None = None
    line_rate_note: str = ""
    peer_access: bool | None = None  # cuda_peer_copy: torch.cuda.can_device_access_peer(dst, src)
    bytes: NonNegativeInt | None = None  # per copy
    repeats: NonNegativeInt | None = None  # timed copies (after one untimed)
    seconds: list[NonNegativeFloat] = []  # each timed copy
    node: int | None = None
    servers: list[str] = []  # the prefill and decode servers whose devices these are
    took_s: NonNegativeFloat | None = None  # the whole measurement, interpreter start included

    def rates(self) -> list[float]:
        """GB/s of each timed copy."""
        return [self.bytes / s / 1e9 for s in self.seconds if s > 0] if self.bytes else []

    @property
    def measured_gbps(self) -> float | None:
        """The median copy's (or transfer's) rate (None when missing)."""
        r = self.rates()
        return statistics.median(r) if self.status == "measured" and r else None

    @property
    def gbps(self) -> float | None:
        """The ceiling: the median copy's rate, or the line rate when that is lower (None when missing)."""
        m = self.measured_gbps
        if m is None or self.line_rate_gbps is None:
            return m
        return min(m, self.line_rate_gbps)

    @property
    def best_gbps(self) -> float | None:
        """What a reported rate may not exceed: the line rate when known, else the fastest copy."""
        r = self.rates()
        if self.status != "measured" or not r:
            return None
        return self.line_rate_gbps if self.line_rate_gbps is not None else max(r)

    @property
    def best_what(self) -> str:
        """What best_gbps is, for a reason that cites it."""
        if self.line_rate_gbps is not None:
            return f"the line rate of {self.interface}"
        return "the fastest transfer measured" if self.method == "tcp_stream" else "the fastest copy the node made"

    def describe(self) -> str:
        if self.gbps is None:
            return f"no ceiling: {self.reason or 'not measured'}"
        where = (
            str(self.src_device) if self.src_device == self.dst_device else f"{self.src_device} -> {self.dst_device}"
        )
        if self.interface:
            where += f" over {self.interface}"
        text = (
            f"{self.gbps:.1f} GB/s ({self.method}, {where}, {(self.bytes or 0) / (1 << 20):,.0f} MiB, "
            f"median of {len(self.seconds)}"
        )
        if self.method != "tcp_stream":
            return text + ")"
        measured = f"{self.measured_gbps:.2f} GB/s measured"
        if self.line_rate_gbps is None:
            return f"{text}: {measured}; no line rate: {self.line_rate_note})"
        return f"{text}: {measured}, line rate {self.line_rate_gbps:.2f} GB/s ({self.line_rate_note}))"


def missing(reason: str, **fields: object) -> KvCeiling:
    return KvCeiling.model_validate({"status": "missing", "reason": reason, **fields})


def read(path: Path) -> KvCeiling | None:
    """The record at `path`; None when there is none (not a pdbench job). A record that does not
    read is a missing ceiling that says so, naming the file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        return missing(f"{path}: {e}")
    try:
        return KvCeiling.model_validate_json(text)
    except ValidationError as e:
        return missing(f"{path} does not read as a KV ceiling record: {e.errors()[0]['msg']}")
