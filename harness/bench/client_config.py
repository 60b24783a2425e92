"""ClientConfig: one sweep's BenchmarkSettings plus where it sends requests and writes results."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)

from harness import kv_connectors
from harness.config.benchmark import ENDPOINT_PATHS, BenchmarkSettings
from harness.rundir.paths import METRICS, SENTINELS

if TYPE_CHECKING:
    from harness.bench.client import Target

__all__ = ["ENDPOINT_PATHS", "BenchmarkSettings", "ClientConfig"]

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110's token)
_OWN_HEADERS = frozenset({"host", "content-length", "content-type", "accept", "transfer-encoding", "connection"})


class ClientConfig(BenchmarkSettings):
    """What `pdbench bench` runs: the settings a recipe holds and the job's bindings."""

    base_url: str = Field(description="Server URL, e.g. http://127.0.0.1:30000.")
    model: str = Field(min_length=1, description="Served model name sent in requests.")
    tokenizer: str = Field(
        "",  # filled from model before validation (_tokenizer_from_model)
        min_length=1,
        description="Tokenizer path or HF id, as `vllm bench serve --tokenizer`.",
        json_schema_extra={"cli_default": "the --model value"},
    )
    result_dir: str = Field(
        min_length=1,
        description="Directory the per-point result JSON files go to (the files themselves, not a root of runs).",
        json_schema_extra={"cli_flags": ["--results-dir"]},
    )
    # The GPUs behind base_url, for the file name and per-GPU figures: prefill_gpus and
    # decode_gpus (both) for a disaggregated deployment, or gpus for one aggregated server
    # (baseline, router, single vLLM); none of them: the split is unknown, and said so.
    # A split needs a prefill GPU: InferenceX's ingestion divides input throughput by it.
    prefill_gpus: PositiveInt | None = Field(
        None,
        description="Prefill GPUs, with decode_gpus: file name and per-GPU figures.",
        json_schema_extra={"cli_default": "none, split unknown"},
    )
    decode_gpus: NonNegativeInt | None = Field(
        None, description="Decode GPUs, with prefill_gpus.", json_schema_extra={"cli_default": "none, split unknown"}
    )
    gpus: PositiveInt | None = Field(
        None,
        description="GPUs of one aggregated server (no prefill/decode split): per-GPU figures for a baseline.",
        json_schema_extra={"cli_default": "none"},
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="JSON object copied into each result's metadata.",
        json_schema_extra={"cli_format": "json", "cli_default": "{}"},
    )
    proxy_timings_dir: str | None = Field(
        None,
        description="The proxy's per-request timings (what `pdbench proxy --timings-dir` writes), relative to "
        "result_dir: each request is tagged (X-Pdbench-Id) and each point gets its TTFT breakdown (ttft_breakdown).",
        json_schema_extra={"cli_flags": ["--timings-dir"], "cli_default": "none, no breakdown"},
    )
    server_logs_dir: str | None = Field(
        None,
        description="Where the scraped servers' logs lie (<name>.log), relative to result_dir: NIXL's KV lane is "
        "read from decode's, where UCX printed the protocol it selected (UCX_PROTO_INFO).",
        json_schema_extra={"cli_default": "none, NIXL's lane not proven"},
    )
    runtime_records_dir: str | None = Field(
        None,
        description="Where the job's nodes record what each server runs on (interpreter, torch and connector "
        "library versions) and the image each node ran, relative to result_dir; every result's metadata "
        "carries them (runtime_versions, image_digest).",
        json_schema_extra={"cli_default": "none, not recorded"},
    )
    metrics_dir: str = Field(
        METRICS,
        description="Where each point's server /metrics evidence goes (metrics_dir/concurrency_<C>/), "
        "relative to result_dir.",
    )
    sentinels_dir: str = Field(
        SENTINELS,
        description="Where the sentinel prompts' reference answers (reference.json) and each point's "
        "comparison (<point tag>.json) go, relative to result_dir.",
    )
    kv_connector: str | None = Field(
        None,
        description="The disaggregated deployment's KV connector: which of its counters prove a KV transfer "
        "(harness.validity.kv_evidence). Without it only vLLM's scheduler counters and any connector-looking "
        "failure counters are read.",
        json_schema_extra={"cli_default": "none"},
    )
    scrape: list[str] = Field(
        default_factory=list,
        description="NAME=ROLE@URL of a server whose /metrics judge each point's validity "
        "(harness.bench.validity_probe).",
        json_schema_extra={"cli_format": "repeat", "cli_default": "none, no verdict"},
    )
    server_pids: list[PositiveInt] = Field(
        default_factory=list,
        description="Server process on this machine to watch; the sweep stops at once if one exits.",
        json_schema_extra={"cli_format": "repeat", "cli_flags": ["--server-pid"], "cli_default": "none"},
    )
    resume: bool = Field(
        False,
        description="Keep each point whose result file is already there, complete and valid (same shape, "
        "concurrency and request count, for a trace replay the same trace, speed and span; no failure, "
        "not judged invalid) and run only the others; an "
        "incomplete file is moved to superseded/ first. Without it, any existing file stops the sweep.",
    )
    progress: Literal["auto", "rich", "plain"] = Field(
        "auto", description="Progress display: auto (a rich bar when stderr is a terminal, else plain lines)."
    )
    interrupt_grace_s: float = Field(
        30.0,
        gt=0,
        description="After a first Ctrl-C (SIGINT): how long the requests in flight may take to finish before "
        "they are cancelled; the point is then written as interrupted and the points left are not run. A second "
        "Ctrl-C cancels them at once.",
    )

    # What `vllm bench serve` users reach for, under its names. Sampling applies to the measured
    # and warm-up requests; the sentinels stay greedy and seeded (they compare answers).
    temperature: NonNegativeFloat | None = Field(
        None,
        description="Sampling temperature of every measured and warm-up request, as `vllm bench serve --temperature`.",
        json_schema_extra={"cli_default": "0, greedy"},
    )
    top_p: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Top-p sampling, as `vllm bench serve --top-p`.",
        json_schema_extra={"cli_default": "the server's"},
    )
    top_k: int | None = Field(
        None,
        ge=-1,
        description="Top-k sampling (-1 or 0: off), as `vllm bench serve --top-k`.",
        json_schema_extra={"cli_default": "the server's"},
    )
    header: list[str] = Field(
        default_factory=list,
        description="KEY=VALUE of a header sent with every request, as `vllm bench serve --header`; results "
        "and logs name the header, never its value.",
        json_schema_extra={"cli_format": "repeat", "cli_default": "none"},
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the server's API key, sent as `Authorization: Bearer` when "
        "set (as `vllm bench serve` reads OPENAI_API_KEY). A variable, not a flag: a key on the command line "
        "is in the process list and the shell's history; results record the variable's name only.",
    )

    @field_validator("header")
    @classmethod
    def _check_headers(cls, v: list[str]) -> list[str]:
        for item in v:
            name, sep, value = item.partition("=")
            if not sep or not _TOKEN.fullmatch(name.strip()):
                raise ValueError(f"{item.split('=')[0]!r}: expected KEY=VALUE with KEY a header name")
            if name.strip().lower() in _OWN_HEADERS:
                raise ValueError(f"{name.strip()}: the client sets this header itself")
            if any(c in value for c in "\r\n\0"):
                raise ValueError(f"{name.strip()}: a header value cannot hold a line break")
        return v

    @property
    def sampling(self) -> dict[str, float | int]:
        """The sampling parameters given, by their request-body names."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return {k: v for k, v in given.items() if v is not None}

    def request_headers(self) -> dict[str, str]:
        """The headers every request carries: the API key's (from api_key_env), then --header's."""
        out: dict[str, str] = {}
        if key := os.environ.get(self.api_key_env):
            out["Authorization"] = f"Bearer {key}"
        for item in self.header:
            name, _, value = item.partition("=")
            out[name.strip()] = value.strip()
        return out

    def request_record(self) -> dict[str, Any]:
        """What the requests were asked, for each result's metadata: sampling, the headers' names,
        where the API key came from; never a header's value nor the key."""
        return {
            "sampling": self.sampling or {"temperature": 0},
            "ignore_eos": self.ignore_eos,
            "headers": sorted(self.request_headers()),
            "api_key": f"${self.api_key_env}" if os.environ.get(self.api_key_env) else None,
        }

    def target(self) -> Target:
        """Where requests go, with the headers each carries."""
        from harness.bench.client import Target  # the HTTP client's imports only when sending

        return Target.from_url(self.url, self.request_headers())

    @model_validator(mode="before")
    @classmethod
    def _tokenizer_from_model(cls, data: Any) -> Any:
        """No tokenizer given: the model's, as `vllm bench serve` does (a path or HF id serves both)."""
        if isinstance(data, dict) and data.get("tokenizer") is None and isinstance(data.get("model"), str):
            return data | {"tokenizer": data["model"]}
        return data

    @field_validator("kv_connector")
    @classmethod
    def _check_connector(cls, v: str | None) -> str | None:
        if v is not None:
            kv_connectors.get_kv(v)  # the connector table is the one list of names
        return v

    @field_validator("base_url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _check_gpus(self) -> ClientConfig:
        if (self.prefill_gpus is None) != (self.decode_gpus is None):
            missing = "decode_gpus" if self.decode_gpus is None else "prefill_gpus"
            raise ValueError(f"{missing}: give prefill_gpus and decode_gpus together (or gpus for one server)")
        if self.gpus is not None and self.prefill_gpus is not None:
            raise ValueError("gpus: for one aggregated server; a disaggregated split is prefill_gpus + decode_gpus")
        return self

    @property
    def disagg(self) -> bool:
        return self.prefill_gpus is not None

    @property
    def url(self) -> str:
        return self.base_url + ENDPOINT_PATHS[self.endpoint]
