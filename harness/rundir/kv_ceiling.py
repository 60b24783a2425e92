"""The same-job KV ceiling (state/kv_ceiling.json): the rate the KV's path could have at most on
this node, measured before the sweep (harness.node.kv_ceiling), read by the bench client to judge
each point's achieved KV rate against it (harness.validity.kv_transport).

This model is the one definition of the format. A ceiling that could not be had is recorded too
(`status: missing` with its reason), so a point without a verdict says why.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt, ValidationError

Method = Literal["cuda_peer_copy", "cuda_device_copy", "host_memcpy"]


class KvCeiling(BaseModel):
    model_config = ConfigDict(frozen=True)
    status: Literal["measured", "missing"]
    reason: str = ""  # why missing, or what was measured instead of what was asked
    method: Method | None = None
    src_device: str | None = None  # prefill's side, e.g. "cuda:1 NVIDIA H200"
    dst_device: str | None = None  # decode's side
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
    def gbps(self) -> float | None:
        """The ceiling: the median copy's rate (None when missing)."""
        r = self.rates()
        return statistics.median(r) if self.status == "measured" and r else None

    @property
    def best_gbps(self) -> float | None:
        r = self.rates()
        return max(r) if self.status == "measured" and r else None

    def describe(self) -> str:
        if self.gbps is None:
            return f"no ceiling: {self.reason or 'not measured'}"
        where = self.src_device if self.src_device == self.dst_device else f"{self.src_device} -> {self.dst_device}"
        return (
            f"{self.gbps:.1f} GB/s ({self.method}, {where}, {(self.bytes or 0) / (1 << 20):,.0f} MiB, "
            f"median of {len(self.seconds)})"
        )


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
