"""Settings of the pdbench connector, read once from `kv_connector_extra_config`."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

DEFAULT_PORT = 17600


@dataclass(frozen=True)
class PdbenchConfig:
    # Where prefill workers listen: rank r of data-parallel engine d uses
    # port + d * tp_size + r. `host` is what decode instances are told to dial.
    host: str | None = None
    port: int = DEFAULT_PORT
    bind_host: str = "0.0.0.0"
    # Prefill keeps a finished request's blocks this long unless decode acks
    # or releases them first; a read after expiry is refused, never served stale.
    lease_s: float = 120.0
    # Bounded waits: a peer that sends nothing for io_timeout_s is dead.
    io_timeout_s: float = 20.0
    connect_timeout_s: float = 5.0
    # A pull may race the prefill worker learning about its request (one engine step).
    register_timeout_s: float = 10.0
    # TCP keepalive probes detect a dead host on an idle pooled connection.
    keepalive_idle_s: int = 5
    keepalive_interval_s: int = 2
    keepalive_count: int = 3
    # SO_SNDBUF/SO_RCVBUF of transfer sockets (the kernel caps them); 0 keeps autotuning.
    sock_buf_bytes: int = 8 << 20
    # Device staging (CUDA): pinned chunk size and pipeline depth.
    chunk_bytes: int = 16 << 20
    pipeline_depth: int = 3
    # Test only: zero the last received block of every layer (the most recent
    # tokens), to prove the correctness test sees corrupted KV; and slow each
    # received chunk down, to kill a peer in the middle of a transfer.
    debug_corrupt: bool = False
    debug_chunk_delay_s: float = 0.0

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> PdbenchConfig:
        extra = dict(extra or {})
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in extra.items():
            if key not in known:
                continue  # other connectors' keys (e.g. kv_lease_duration) are ignored
            kwargs[key] = _coerce(value, known[key].type)
        if "lease_s" not in kwargs and "kv_lease_duration" in extra:
            kwargs["lease_s"] = float(extra["kv_lease_duration"])  # NIXL's name, for recipe reuse
        if "port" not in kwargs and os.environ.get("PDBENCH_KV_PORT"):
            kwargs["port"] = int(os.environ["PDBENCH_KV_PORT"])
        if "host" not in kwargs:
            # pdbench's node runtime exports each node's address as PDBENCH_NODE_ADDR.
            kwargs["host"] = (os.environ.get("PDBENCH_KV_HOST") or os.environ.get("PDBENCH_NODE_ADDR")
                              or os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST"))
        if os.environ.get("PDBENCH_KV_DEBUG_CORRUPT") == "1":
            kwargs["debug_corrupt"] = True
        return cls(**kwargs)

    def advertised_host(self) -> str:
        if self.host:
            return self.host
        try:
            from vllm.utils.network_utils import get_ip

            return get_ip()
        except Exception:  # outside vLLM (tests, benchmarks)
            return "127.0.0.1"

    def listen_port(self, dp_index: int, tp_size: int, tp_rank: int) -> int:
        return self.port + dp_index * tp_size + tp_rank


def _coerce(value: Any, typ: Any) -> Any:
    t = str(typ)
    if "bool" in t:
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
    if "float" in t:
        return float(value)
    if "int" in t:
        return int(value)
    return None if value is None else str(value)
