"""A search's candidates: the Cartesian product of its factors, each a planned recipe."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Candidate:
    name: str  # "1p2d" (+ "-<other factor values>" when other factors vary); a safe folder name
    kind: Literal["disagg", "agg"]
    overrides: tuple[str, ...]  # --set overrides making this candidate from the base recipe (search ones included)
    prefill_devices: int  # agg: all its devices here, decode_devices 0
    decode_devices: int
    nodes: int
    capacity: Mapping[str, float]  # role -> compute units: GPU sites devices; CPU sites (gpus_per_node 0) the
    # distinct cores in the role's cpu_bind (else its workers); keys prefill/decode or aggregated

    @property
    def devices(self) -> int:
        return self.prefill_devices + self.decode_devices
