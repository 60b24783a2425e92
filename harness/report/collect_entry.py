"""One entry of `pdbench collect`'s aggregate: the keys and types of InferenceX's `agg_*.json`
(multinode), validated before anything is written."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from harness.strict import Strict

FiniteNonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Router(Strict):
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)


class CollectEntry(BaseModel):
    """One point, keyed as InferenceX's `agg_*.json` (multinode); latency keys are extra fields."""

    model_config = ConfigDict(extra="allow")

    hw: str = Field(min_length=1)
    conc: PositiveInt
    image: str
    model: str = Field(min_length=1)
    infmax_model_prefix: str = Field(min_length=1)
    framework: str = Field(min_length=1)
    precision: str = Field(min_length=1)
    spec_decoding: str = Field(min_length=1)
    disagg: bool
    recipe_fingerprint: str
    isl: PositiveInt
    osl: PositiveInt
    router: Router | None = None
    kv_p2p_transfer: str | None = None
    is_multinode: Literal[True] = True
    prefill_tp: PositiveInt
    prefill_pp: PositiveInt = 1
    prefill_dcp_size: PositiveInt = 1
    prefill_pcp_size: PositiveInt = 1
    prefill_ep: PositiveInt
    prefill_dp_attention: Literal["true", "false"]
    prefill_num_workers: PositiveInt
    decode_tp: NonNegativeInt
    decode_pp: PositiveInt = 1
    decode_dcp_size: PositiveInt = 1
    decode_pcp_size: PositiveInt = 1
    decode_ep: NonNegativeInt
    decode_dp_attention: Literal["true", "false"]
    decode_num_workers: NonNegativeInt
    num_prefill_gpu: PositiveInt
    num_decode_gpu: NonNegativeInt
    tput_per_gpu: FiniteNonNeg
    output_tput_per_gpu: FiniteNonNeg
    input_tput_per_gpu: FiniteNonNeg

    @model_validator(mode="after")
    def _latencies_are_numbers(self) -> CollectEntry:
        for key, value in (self.model_extra or {}).items():
            if key == "valid":
                if value is not False:
                    raise ValueError("valid, when present, is false (an invalid point kept on request)")
                continue
            if key == "validity":
                if value not in ("invalid", "unverified"):
                    raise ValueError("validity, when present, is invalid or unverified (a point kept on request)")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{key} is not a finite number ({value!r})")
        return self

    def dump(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)
