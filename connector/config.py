"""Settings of the pdbench connector, read once from `kv_connector_extra_config`."""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_PORT = 17600
# The job secret (see connector/auth.py) is read from `secret_file`, the path the renderer
# passes (harness.rundir.paths.SECRET, written by pdbench's node runtime).
MIN_SECRET_BYTES = 16


@dataclass(frozen=True)
class PdbenchConfig:
    # Where prefill workers listen: rank r of data-parallel engine d uses
    # port + d * tp_size + r. `host` is what decode instances are told to dial.
    host: str | None = None
    port: int = DEFAULT_PORT
    # Where prefill's KV server binds; None: `host`, the one address decode dials
    # (never every interface unless asked with "0.0.0.0").
    bind_host: str | None = None
    # A file holding the job's shared secret; every peer must prove it knows it
    # before any other message (connector/auth.py). Without one, the KV server
    # refuses to listen on anything but loopback.
    secret_file: str | None = None
    secret: bytes | None = field(default=None, repr=False, compare=False)  # loaded from secret_file
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
    # Decode, in an engine step with nothing to compute: wait up to this long for an in-flight
    # pull to finish (0: never), so the request is scheduled a step sooner and the IO thread
    # has its core to itself instead of sharing it with vLLM's spinning model thread.
    idle_wait_s: float = 0.02
    # Nice value of the transfer thread (-20..19). Below 0 it preempts vLLM's model thread,
    # which busy-polls the same core after each step (just when prefill's KV is pulled);
    # needs CAP_SYS_NICE (root, or a container given it), else the thread stays at 0.
    io_nice: int = -10
    # Decode started before prefill finished (kv_transfer_params `pull_key`: the proxy's
    # overlapped flow): its pull waits up to this long (capped by prefill's lease_s) for
    # prefill to finish the request.
    early_wait_s: float = 60.0
    # Same host, CUDA caches on both sides: pull GPU to GPU through CUDA IPC (TCP only
    # carries pull/ok/ack). Either side can turn it off; a mismatch falls back to TCP.
    ipc: bool = True
    # Decode: where to write per-request load timings (connector/timings.py), for requests
    # whose kv_transfer_params carry a pdbench_id; None: none recorded. pdbench jobs give the
    # run directory's timings directory, beside the proxy's records.
    timings_dir: str | None = None
    # Test only: zero the last received block of every layer (the most recent
    # tokens), to prove the correctness test sees corrupted KV; and slow each
    # received chunk down, to kill a peer in the middle of a transfer.
    debug_corrupt: bool = False
    debug_chunk_delay_s: float = 0.0

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> PdbenchConfig:
        """The connector's settings, all from kv_connector_extra_config (nothing from the
        environment: the rendered `vllm serve` line shows every one). Unknown keys are errors."""
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(ACCEPTED_KEYS))
        if unknown:
            raise ValueError(
                f"pdbench connector: unknown kv_connector_extra_config key(s) {', '.join(unknown)}; "
                f"accepted: {', '.join(ACCEPTED_KEYS)}"
            )
        types = {f.name: f.type for f in fields(cls)}
        kwargs: dict[str, Any] = {key: _coerce(value, types[key]) for key, value in extra.items()}
        if kwargs.get("host") is None:
            kwargs["host"] = _vllm_ip()  # this host's address as vLLM sees it
        if kwargs.get("secret_file"):
            kwargs["secret"] = load_secret(kwargs["secret_file"])
        return cls(**kwargs)

    def advertised_host(self) -> str:
        """The address decode is told to dial (from_extra fills it in vLLM)."""
        return self.host or "127.0.0.1"

    def listen_host(self) -> str:
        """The one address prefill's KV server binds: bind_host, else the advertised one."""
        return self.bind_host or self.advertised_host()

    def listen_port(self, dp_index: int, tp_size: int, tp_rank: int) -> int:
        return self.port + dp_index * tp_size + tp_rank


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """The secret in a file (surrounding whitespace dropped); a configured file must be usable."""
    p = Path(path)
    try:
        st = p.stat()
        data = p.read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"pdbench connector: cannot read the job secret {p}: {exc}") from exc
    if len(data) < MIN_SECRET_BYTES:
        raise ValueError(f"pdbench connector: job secret {p} is shorter than {MIN_SECRET_BYTES} bytes")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "pdbench connector: job secret %s is accessible by group/others (mode %o); it should be 0600",
            p,
            st.st_mode & 0o777,
        )
    return data


def _vllm_ip() -> str | None:
    try:
        from vllm.utils.network_utils import get_ip

        return get_ip()
    except Exception:  # outside vLLM (tests, benchmarks): loopback
        return None


def _coerce(value: Any, typ: Any) -> Any:
    t = str(typ)
    if "bool" in t:
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
    if "float" in t:
        return float(value)
    if "int" in t:
        return int(value)
    return None if value is None else str(value)


# The keys kv_connector_extra_config may hold: every setting but the secret itself, which
# never travels on a command line (argv is public); the recipe schema checks them too.
ACCEPTED_KEYS: tuple[str, ...] = tuple(f.name for f in fields(PdbenchConfig) if f.name != "secret")
