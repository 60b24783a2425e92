"""BenchConfig: everything one benchmark sweep needs, validated up front."""

from __future__ import annotations

import math
from typing import Any, Literal

from harness.validity import ValidityThresholds
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class BenchConfig(BaseModel):
    # ser_json_inf_nan="strings": an infinite request_rate round-trips through the
    # JSON file the job writes ("Infinity") instead of becoming null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    base_url: str
    endpoint: Literal["completions", "chat"] = "completions"
    model: str = Field(min_length=1)
    tokenizer: str = Field(min_length=1)
    isl: PositiveInt
    osl: PositiveInt
    range_ratio: float = 1.0
    range_ratio_convention: Literal["inferencex", "vllm"] = "inferencex"
    concurrency: list[PositiveInt] = Field(min_length=1)
    request_rate: PositiveFloat = math.inf
    num_prompts: PositiveInt | None = None
    prompts_multiplier: PositiveInt = 10
    min_prompts: PositiveInt = 16
    num_warmups: NonNegativeInt | None = None
    cooldown_s: NonNegativeFloat = 0.0
    request_timeout_s: PositiveFloat = 600.0
    # Not in vLLM: bound on one whole point (warmups and measured requests each);
    # None derives it from request_timeout_s so a stuck server cannot hang a job.
    point_timeout_s: PositiveFloat | None = None
    seed: NonNegativeInt = 0
    ignore_eos: bool = True
    percentiles: list[float] = Field(default_factory=lambda: [90.0, 99.0, 99.9])
    result_dir: str = Field(min_length=1)
    # The GPUs behind base_url, for the file name and per-GPU figures: prefill_gpus and
    # decode_gpus (both) for a disaggregated deployment, or gpus for one aggregated server
    # (baseline, router, single vLLM); none of them: the split is unknown, and said so.
    # A split needs a prefill GPU: InferenceX's ingestion divides input throughput by it.
    prefill_gpus: PositiveInt | None = None
    decode_gpus: NonNegativeInt | None = None
    gpus: PositiveInt | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Servers whose /metrics are scraped around every point to judge its validity,
    # as NAME=ROLE@URL (harness.bench.validity_probe); none: no verdict is recorded.
    scrape: list[str] = Field(default_factory=list)
    validity: ValidityThresholds = Field(default_factory=ValidityThresholds)

    # Dataset: random prompts of exact length (isl/osl/range_ratio), or prompts from a
    # file: "jsonl" (one {"prompt": str, "output_len": int?} per line) or "sharegpt"
    # (a JSON list of {"conversations": [{"from", "value"}, ...]}).
    dataset: Literal["random", "jsonl", "sharegpt"] = "random"
    dataset_path: str | None = None
    # Tokens of one random prefix shared by every prompt of the sweep, before the
    # isl-sampled part (vLLM's --random-prefix-len: prompt = prefix + isl tokens).
    random_prefix_len: NonNegativeInt = 0
    # Gamma-distributed arrival gaps at a finite request_rate: 1 Poisson, <1 burstier.
    burstiness: PositiveFloat = 1.0
    # SLOs in ms for request_goodput ("ttft", "tpot", "e2el"), as vLLM's --goodput.
    goodput: dict[Literal["ttft", "tpot", "e2el"], NonNegativeFloat] = Field(default_factory=dict)
    # Bound on the whole sweep; when it hits, the running point keeps what finished
    # (written, with stop_reason) and the points left are not run.
    total_timeout_s: PositiveFloat | None = None
    # Poll <base_url>/health this often (0: never); the sweep stops at once when the
    # target cannot be reached, or answers 5xx / times out three times in a row.
    health_check_interval_s: NonNegativeFloat = 2.0
    # Server processes on this machine to watch; the sweep stops at once if one exits.
    server_pids: list[PositiveInt] = Field(default_factory=list)
    # "auto": a rich progress bar when stderr is a terminal, plain log lines otherwise.
    progress: Literal["auto", "rich", "plain"] = "auto"

    @field_validator("base_url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @field_validator("concurrency")
    @classmethod
    def _unique_concurrency(cls, v: list[int]) -> list[int]:
        # Each point has its own result file name, so duplicates would collide.
        if len(set(v)) != len(v):
            raise ValueError("concurrency values must be unique")
        return v

    @field_validator("percentiles")
    @classmethod
    def _check_percentiles(cls, v: list[float]) -> list[float]:
        if any(not 0 <= p <= 100 for p in v):
            raise ValueError("percentiles must be within [0, 100]")
        return v

    @model_validator(mode="after")
    def _check_gpus(self) -> BenchConfig:
        if (self.prefill_gpus is None) != (self.decode_gpus is None):
            missing = "decode_gpus" if self.decode_gpus is None else "prefill_gpus"
            raise ValueError(f"{missing}: give prefill_gpus and decode_gpus together (or gpus for one server)")
        if self.gpus is not None and self.prefill_gpus is not None:
            raise ValueError("gpus: for one aggregated server; a disaggregated split is prefill_gpus + decode_gpus")
        return self

    @property
    def disagg(self) -> bool:
        return self.prefill_gpus is not None

    @model_validator(mode="after")
    def _check_dataset(self) -> BenchConfig:
        if self.dataset != "random" and not self.dataset_path:
            raise ValueError(f"dataset {self.dataset!r} needs dataset_path")
        if self.dataset == "random" and self.dataset_path:
            raise ValueError("dataset_path is only for dataset 'jsonl' or 'sharegpt'")
        return self

    @model_validator(mode="after")
    def _check_range_ratio(self) -> BenchConfig:
        r = self.range_ratio
        if self.range_ratio_convention == "inferencex" and not 0.0 <= r <= 1.0:
            raise ValueError("range_ratio must be in [0, 1] for the inferencex convention")
        if self.range_ratio_convention == "vllm" and not 0.0 <= r < 1.0:
            # Same bound as vLLM's RandomDataset.
            raise ValueError("range_ratio must be in [0, 1) for the vllm convention")
        return self

    @property
    def url(self) -> str:
        return self.base_url + ENDPOINT_PATHS[self.endpoint]

    def num_prompts_for(self, concurrency: int) -> int:
        if self.num_prompts is not None:
            return self.num_prompts
        return max(self.min_prompts, self.prompts_multiplier * concurrency)

    def num_warmups_for(self, concurrency: int) -> int:
        return 2 * concurrency if self.num_warmups is None else self.num_warmups

    def point_timeout_for(self, num_requests: int, concurrency: int) -> float:
        """Upper bound for one batch of requests (warmups or the measured run)."""
        if self.point_timeout_s is not None:
            return self.point_timeout_s
        waves = math.ceil(num_requests / max(1, concurrency))
        arrivals = 0.0 if math.isinf(self.request_rate) else num_requests / self.request_rate
        return (waves + 1) * self.request_timeout_s + 2 * arrivals
