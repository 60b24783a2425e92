"""Scheduler -> worker messages of one engine step (pickled inside SchedulerOutput)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass(frozen=True)
class SendSpec:
    """Prefill: a finished request whose blocks decode will pull (lease starts on arrival)."""

    req_id: str
    block_ids: list[int]
    key: str | None = None  # the proxy's pull key: decode asks for the blocks by it


@dataclass(frozen=True)
class RecvSpec:
    """Decode: pull tokens [first_token, num_tokens) of a remote request into `block_ids`."""

    req_id: str
    remote_req_id: str
    remote_engine_id: str
    remote_host: str
    remote_port: int  # rank 0's port; rank r dials remote_port + r
    remote_tp_size: int
    first_token: int  # tokens already cached locally (whole blocks)
    num_tokens: int
    block_ids: list[int]  # local blocks for tokens first_token.. (unhashed, owned)
    early: bool = False  # sent before prefill finished (pull_key): the pull may wait for it
    # Timed requests only (connector/timings.py): the proxy's id, the scheduler's queue_ms.
    pdbench_id: str | None = None
    queue_ms: float | None = None


@dataclass(frozen=True)
class ReleaseSpec:
    """Decode: the request will never pull; let prefill free its blocks now."""

    remote_req_id: str
    remote_engine_id: str
    remote_host: str
    remote_port: int
    remote_tp_size: int = 1


@dataclass(frozen=True)
class FirstStep:
    """Decode, timed requests: this step is the request's first; the scheduler's durations (ms)."""

    load_ms: float  # blocks allocated -> load reported finished
    ready_ms: float  # load reported finished -> this step scheduled


@dataclass
class PdbenchMetadata(KVConnectorMetadata):
    sends: list[SendSpec] = field(default_factory=list)
    recvs: list[RecvSpec] = field(default_factory=list)
    releases: list[ReleaseSpec] = field(default_factory=list)
    first_steps: dict[str, FirstStep] = field(default_factory=dict)  # by vLLM request id
    idle: bool = False  # the step runs no forward pass: the worker may wait for its pulls
