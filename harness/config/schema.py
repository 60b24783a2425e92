"""Pydantic schema of models.yaml and recipes/*.yaml.

Validated once at load time; nothing downstream re-validates. Every model forbids
unknown keys so that a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# A vLLM flag value: True renders a bare flag, False/None omits it, dicts and lists render as JSON.
FlagValue = Union[bool, int, float, str, None, dict[str, Any], list[Any]]
Flags = dict[str, FlagValue]
Env = dict[str, str]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(Strict):
    path: Optional[str] = Field(None, description="local model directory (relative to models.yaml)")
    hf_id: Optional[str] = Field(None, description="Hugging Face id, resolved by vLLM inside the job")
    precision: str
    tokenizer: Optional[str] = None
    served_model_name: Optional[str] = None
    max_model_len: int = Field(gt=0)
    prefill_flags: Flags = {}
    decode_flags: Flags = {}
    env: Env = {}
    prefill_env: Env = {}
    decode_env: Env = {}
    build: Optional[Literal["tiny-llama"]] = Field(
        None, description="builder that makes `path` offline when it is missing"
    )

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        if (self.path is None) == (self.hf_id is None):
            raise ValueError("set exactly one of 'path' or 'hf_id'")
        return self

    @property
    def source(self) -> str:
        return self.path if self.path is not None else self.hf_id  # type: ignore[return-value]


class Catalogue(Strict):
    models: dict[str, ModelSpec]


class RoleSpec(Strict):
    nodes: int = Field(1, ge=1, description="nodes given to this role")
    workers: int = Field(1, ge=1, description="independent vLLM instances of this role")
    tp: int = Field(1, ge=1, description="tensor-parallel size per worker")
    dp: int = Field(1, ge=1, description="data-parallel size per worker")
    ep: int = Field(1, ge=1, description="expert-parallel size; >1 enables expert parallelism")
    dp_attention: bool = Field(False, description="data-parallel attention (needs dp > 1)")
    port: int = Field(ge=1024, le=65535, description="HTTP port of the first worker on a node")
    flags: Flags = {}
    env: Env = {}
    cpu_bind: list[str] = Field(
        [], description="CPU-only: VLLM_CPU_OMP_THREADS_BIND per worker (cycled)"
    )
    kv_transfer: bool = Field(
        True, description="start with the KV connector; false re-prefills (to check validity rules)"
    )

    @model_validator(mode="after")
    def _check(self) -> "RoleSpec":
        if self.dp_attention and self.dp < 2:
            raise ValueError("dp_attention needs dp > 1")
        if self.ep > 1 and self.ep != self.tp * self.dp:
            raise ValueError(f"ep must be 1 or tp*dp = {self.tp * self.dp} (vLLM sets EP = TP x DP)")
        return self

    @property
    def gpus_per_worker(self) -> int:
        return self.tp * self.dp


class TopologySpec(Strict):
    gpus_per_node: int = Field(8, ge=0, description="0 for CPU-only nodes")
    nic_detection: bool = Field(True, description="servers source `pdbench nic` (RDMA env) before starting")
    prefill: RoleSpec
    decode: RoleSpec


class ConnectorSpec(Strict):
    name: Literal["nixl", "moriio", "mooncake", "pdbench"]
    kv_buffer_device: Optional[Literal["cpu", "cuda"]] = None
    side_channel_port: int = Field(5600, ge=1024, le=65535, description="NIXL side-channel base port")
    read_mode: bool = Field(False, description="MoRI-IO READ mode (decode pulls KV)")
    proxy_ping_port: int = Field(36367, ge=1024, le=65535, description="MoRI-IO registration port")
    extra_config: dict[str, Any] = {}


class ProxySpec(Strict):
    kind: Literal["pdbench"] = "pdbench"
    port: int = Field(30000, ge=1024, le=65535)
    policy: Literal["round_robin", "least_outstanding", "prefix_hash"] = "round_robin"
    request_timeout_s: float = Field(600, gt=0)
    stream_idle_timeout_s: float = Field(300, gt=0)


class BenchmarkSpec(Strict):
    isl: int = Field(gt=0)
    osl: int = Field(gt=0)
    range_ratio: float = Field(1.0, ge=0, le=1)
    range_ratio_convention: Literal["inferencex", "vllm"] = "inferencex"
    concurrency: list[int] = Field(min_length=1)
    request_rate: float = Field(math.inf, gt=0)
    num_prompts: Optional[int] = Field(None, gt=0, description="per point; default multiplier x C")
    prompts_multiplier: int = Field(10, ge=1)
    min_prompts: int = Field(16, ge=1)
    num_warmups: Optional[int] = Field(None, ge=0, description="per point; default 2 x C")
    cooldown_s: float = Field(0, ge=0)
    request_timeout_s: float = Field(600, gt=0)
    endpoint: Literal["completions", "chat"] = "completions"
    seed: int = 0

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError("every concurrency must be >= 1")
        return v


class ContainerSpec(Strict):
    runtime: Literal["docker", "podman", "enroot", "apptainer", "none"] = "docker"
    image: Optional[str] = None
    mounts: dict[str, str] = Field({}, description="host path -> container path")

    @model_validator(mode="after")
    def _image(self) -> "ContainerSpec":
        if self.runtime != "none" and not self.image:
            raise ValueError(f"container runtime '{self.runtime}' needs an image")
        return self


class SlurmSpec(Strict):
    job_name: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_limit: str = "02:00:00"
    nodelist: Optional[str] = None
    exclude: Optional[str] = None
    reservation: Optional[str] = None
    constraint: Optional[str] = None
    extra_sbatch: list[str] = []


class TimeoutSpec(Strict):
    rendezvous_s: float = Field(600, gt=0, description="all nodes of the job have started")
    health_s: float = Field(1800, gt=0, description="every server and the proxy are ready")
    smoke_s: float = Field(300, gt=0, description="one request through the proxy")
    bench_s: float = Field(4 * 3600, gt=0, description="the whole sweep")
    teardown_s: float = Field(30, gt=0, description="SIGTERM to SIGKILL grace")
    job_s: float = Field(6 * 3600, gt=0, description="local launcher: whole job")


class Recipe(Strict):
    name: Optional[str] = None
    description: str = ""
    model: str
    container: ContainerSpec = ContainerSpec(runtime="none")
    topology: TopologySpec
    connector: ConnectorSpec
    proxy: ProxySpec = ProxySpec()
    benchmark: BenchmarkSpec
    slurm: SlurmSpec = SlurmSpec()
    timeouts: TimeoutSpec = TimeoutSpec()
    env: Env = Field({}, description="environment for every process of the job")
