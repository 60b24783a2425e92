"""Settings of one `pdbench proxy` process."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# none: no disaggregation; each request goes whole to one --aggregated instance (a baseline).
Connector = Literal["nixl", "pdbench", "moriio", "mooncake", "none"]
Policy = Literal["round_robin", "least_outstanding", "prefix_hash"]

CONNECTORS: tuple[str, ...] = ("nixl", "pdbench", "moriio", "mooncake", "none")
POLICIES: tuple[str, ...] = ("round_robin", "least_outstanding", "prefix_hash")
MOONCAKE_DEFAULT_BOOTSTRAP_PORT = 8998  # vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url:
        raise ValueError("empty backend URL")
    # Accept bare host:port, as launch scripts often pass that.
    url = url if "://" in url else f"http://{url}"
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"backend URL must be http(s): {url}")
    return url


class ProxyConfig(BaseModel):
    """Mirrors the `pdbench proxy` options."""

    model_config = ConfigDict(extra="forbid")

    # Listen on one address, never every interface by default: the benchmark client and
    # node 0's health gate reach the proxy on the same node, so jobs pass 127.0.0.1.
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=0, le=65535)
    prefill: list[str] = Field([], description="static prefill base URLs")
    decode: list[str] = Field([], description="static decode base URLs")
    aggregated: list[str] = Field([], description="connector none: base URLs of whole (aggregated) instances")
    connector: Connector = "nixl"
    policy: Policy = "round_robin"
    # Readiness: /health is 200 only when this many instances of each role are ready.
    # Defaults to the number of static URLs (at least 1).
    expected_prefill: int | None = Field(None, ge=1)
    expected_decode: int | None = Field(None, ge=1)
    expected_aggregated: int | None = Field(None, ge=1)
    # Data-parallel size of the static instances (registered ones announce theirs).
    prefill_dp_size: int = Field(1, ge=1)
    decode_dp_size: int = Field(1, ge=1)
    # MoRI-IO: ZMQ ROUTER registration endpoint, and READ or WRITE mode (None: the
    # first registration decides; later ones that disagree are rejected). Workers on
    # other nodes register here, so jobs bind it to the node's address ($PDBENCH_NODE_ADDR).
    moriio_host: str = "127.0.0.1"
    moriio_port: int | None = Field(None, ge=1, le=65535)
    moriio_mode: Literal["read", "write"] | None = None
    registration_ttl_s: float = Field(30.0, gt=0, description="drop a Gen-2 instance silent this long")
    max_registered: int = Field(1024, ge=1, description="cap on registered instances (memory bound)")
    # Mooncake: bootstrap port of every static prefill (one for all, or one per --prefill).
    bootstrap_ports: list[int] = []
    request_timeout_s: float = Field(600.0, gt=0, description="total time for one upstream leg")
    stream_idle_timeout_s: float = Field(300.0, gt=0, description="abort a silent decode stream")
    health_interval_s: float = Field(2.0, gt=0)
    health_timeout_s: float = Field(2.0, gt=0, description="timeout of one backend /health poll")
    health_failures: int = Field(3, ge=1, description="failed polls before a ready backend is not ready")
    breaker_failures: int = Field(5, ge=1, description="consecutive failed legs that take a backend out")
    breaker_min_open_s: float = Field(
        5.0, ge=0, description="out at least this long, then a passing health check re-admits"
    )
    max_body_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    prefix_chars: int = Field(2048, ge=16, description="prefix_hash: prompt characters that choose the instance")
    workers: int = Field(1, ge=1, le=64, description="server processes sharing the port (SO_REUSEPORT)")
    overlap: bool = False  # pdbench connector: decode leg sent with the prefill leg (PdbenchFlow)
    timings_dir: str | None = Field(
        None, description="per-request timings of requests with X-Pdbench-Id, for the TTFT breakdown"
    )

    @field_validator("prefill", "decode", "aggregated")
    @classmethod
    def _normalize_urls(cls, urls: list[str]) -> list[str]:
        return [normalize_url(u) for u in urls]

    @model_validator(mode="after")
    def _check(self) -> ProxyConfig:
        if (self.connector == "none") != bool(self.aggregated):
            raise ValueError("--aggregated instances go with --connector none, and connector none needs them")
        if self.connector == "none":
            if self.prefill or self.decode:
                raise ValueError(
                    "connector none forwards whole requests: give --aggregated URLs, not --prefill/--decode"
                )
        elif self.connector == "moriio":
            if self.moriio_port is None:
                raise ValueError("connector moriio needs a registration port (--moriio-port)")
            if self.prefill or self.decode:
                # A URL cannot carry the handshake/notify ports and sizes the flow needs.
                raise ValueError(
                    "MoRI-IO instances register themselves: give --expected-prefill/"
                    "--expected-decode instead of --prefill/--decode URLs"
                )
        else:
            if not self.prefill or not self.decode:
                raise ValueError(f"connector {self.connector} needs at least one prefill and one decode URL")
            if self.moriio_mode is not None:
                raise ValueError("moriio_mode only applies to connector moriio")
        if self.bootstrap_ports:
            if self.connector != "mooncake":
                raise ValueError("bootstrap ports only apply to connector mooncake")
            if len(self.bootstrap_ports) not in (1, len(self.prefill)):
                raise ValueError("give one bootstrap port, or one per prefill URL")
        if self.overlap and self.connector != "pdbench":
            raise ValueError("overlap only applies to connector pdbench")
        if self.workers > 1 and self.connector == "moriio":
            raise ValueError("connector moriio keeps its registrations in one process: workers must be 1")
        return self

    @property
    def want_prefill(self) -> int:
        if self.connector == "none":
            return 0
        return self.expected_prefill or max(1, len(self.prefill))

    @property
    def want_decode(self) -> int:
        if self.connector == "none":
            return 0
        return self.expected_decode or max(1, len(self.decode))

    @property
    def want_aggregated(self) -> int:
        return self.expected_aggregated or len(self.aggregated)

    def bootstrap_port(self, index: int) -> int:
        if not self.bootstrap_ports:
            return MOONCAKE_DEFAULT_BOOTSTRAP_PORT
        return self.bootstrap_ports[0] if len(self.bootstrap_ports) == 1 else self.bootstrap_ports[index]
