"""Settings of one `pdbench proxy` process: its options are generated from ProxyConfig (cli.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from harness import kv_connectors
from harness.kv_connectors.entry import Connector, ProxyUse
from harness.strict import Strict

if TYPE_CHECKING:
    ConnectorName = str
else:  # every connector of the table; none: each request whole to one --aggregated instance
    ConnectorName = Literal[kv_connectors.proxy_names()]
Policy = Literal["round_robin", "least_outstanding", "prefix_hash", "session"]

# The settings some connectors take (ProxyUse.settings): any other connector rejects them.
_CONNECTOR_SETTINGS = frozenset(s for c in kv_connectors.TABLE.values() for s in c.proxy.settings)


def _cli(**meta: Any) -> dict[str, Any]:
    """How cli.py shows a field: cli_flags, cli_metavar, cli_default (the default's text),
    cli_scale (the flag's unit in the field's: --max-body-mb)."""
    return meta


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url:
        raise ValueError("empty backend URL")
    # Accept bare host:port, as launch scripts often pass that.
    url = url if "://" in url else f"http://{url}"
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"backend URL must be http(s): {url}")
    return url


class ProxyConfig(Strict):
    """Every setting of `pdbench proxy`; each field is a flag of the same name (cli.py)."""

    # Never every interface by default: the benchmark client and node 0's health gate reach
    # the proxy on the same node, so jobs pass 127.0.0.1.
    host: str = Field("127.0.0.1", description="Address to listen on (one address; 0.0.0.0 means every interface).")
    port: int = Field(30000, ge=0, le=65535, description="TCP port to listen on.")
    prefill: list[str] = Field(
        [],
        description="Prefill base URL, e.g. http://10.0.0.1:8100 (required for connectors with static instances).",
        json_schema_extra=_cli(cli_metavar="URL", cli_default="none"),
    )
    decode: list[str] = Field(
        [],
        description="Decode server base URL (required for connectors with static instances).",
        json_schema_extra=_cli(cli_metavar="URL", cli_default="none"),
    )
    aggregated: list[str] = Field(
        [],
        description="With --connector none: a whole (aggregated) instance that serves each request alone, "
        "for a baseline.",
        json_schema_extra=_cli(cli_metavar="URL", cli_default="none"),
    )
    connector: ConnectorName = Field(
        "nixl", description="KV connector flow (none: --aggregated instances, no KV connector)."
    )
    policy: Policy = Field(
        "round_robin",
        description="How an instance is chosen per request. prefix_hash: by the prompt's first --prefix-chars; "
        "session: by the X-Session-Id header (else as prefix_hash), so a session's turns meet its earlier "
        "turns in the same instances' prefix caches.",
    )
    # Readiness: /health is 200 only when this many instances of each role are ready.
    expected_prefill: int | None = Field(
        None,
        ge=1,
        description="Prefill instances /health waits for.",
        json_schema_extra=_cli(cli_default="the number of --prefill URLs"),
    )
    expected_decode: int | None = Field(
        None,
        ge=1,
        description="Decode instances /health waits for.",
        json_schema_extra=_cli(cli_default="the number of --decode URLs"),
    )
    expected_aggregated: int | None = Field(
        None,
        ge=1,
        description="Aggregated instances /health waits for.",
        json_schema_extra=_cli(cli_default="the number of --aggregated URLs"),
    )
    # Registered instances announce their own sizes.
    prefill_dp_size: int = Field(1, ge=1, description="DP ranks behind each static prefill URL.")
    decode_dp_size: int = Field(1, ge=1, description="DP ranks behind each static decode URL.")
    # Workers on other nodes register here, so jobs bind it to the node's address.
    moriio_host: str = Field(
        "127.0.0.1",
        description="MoRI-IO: registration bind address; workers on other nodes must reach it "
        "(a job passes its node's address).",
    )
    moriio_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="MoRI-IO: ZMQ registration TCP port, proxy_ping_port.",
        json_schema_extra=_cli(cli_default="none; required for --connector moriio"),
    )
    moriio_mode: Literal["read", "write"] | None = Field(
        None,
        description="MoRI-IO: READ or WRITE transfers; later registrations that disagree are rejected.",
        json_schema_extra=_cli(cli_default="the first registration's"),
    )
    registration_ttl_s: float = Field(
        30.0, gt=0, description="Drop a registered (Gen-2) instance silent this many seconds."
    )
    max_registered: int = Field(1024, ge=1, description="Cap on registered instances (a memory bound).")
    bootstrap_ports: list[int] = Field(
        [],
        description="Mooncake: prefill bootstrap port (once for all, or once per --prefill).",
        json_schema_extra=_cli(cli_flags=["--bootstrap-port"], cli_metavar="PORT", cli_default="vLLM's, 8998"),
    )
    request_timeout_s: float = Field(600.0, gt=0, description="Seconds allowed for one whole upstream leg.")
    stream_idle_timeout_s: float = Field(300.0, gt=0, description="Abort a decode stream silent for this many seconds.")
    health_interval_s: float = Field(2.0, gt=0, description="Seconds between backend /health polls.")
    health_timeout_s: float = Field(2.0, gt=0, description="Timeout of one backend /health poll (s).")
    health_failures: int = Field(3, ge=1, description="Failed polls in a row before a ready instance is not ready.")
    breaker_failures: int = Field(5, ge=1, description="Failed legs in a row that take an instance out.")
    breaker_min_open_s: float = Field(
        5.0, ge=0, description="An instance taken out stays out this long, then a passing health check re-admits it."
    )
    max_body_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Largest accepted request body (MiB); larger ones get 413.",
        json_schema_extra=_cli(cli_flags=["--max-body-mb"], cli_scale=1024 * 1024),
    )
    prefix_chars: int = Field(
        2048, ge=16, description="prefix_hash and session: the prompt characters that choose the instance."
    )
    workers: int = Field(1, ge=1, le=64, description="Server processes sharing the port (SO_REUSEPORT).")
    overlap: bool = Field(
        False,
        description="pdbench connector: send each request's decode leg together with its prefill leg "
        "(once the prefill instance's KV endpoint is known from its first answer); decode's pull "
        "waits at prefill until the KV is there (off: two phases).",
    )
    timings_dir: str | None = Field(
        None,
        description="Write each request's timings (those with an X-Pdbench-Id header, which `pdbench bench` "
        "sends) to DIR/proxy-timings-<pid>.jsonl, for the TTFT breakdown.",
        json_schema_extra=_cli(cli_metavar="DIR", cli_default="none"),
    )

    @property
    def entry(self) -> Connector:
        return kv_connectors.get(self.connector)

    @property
    def use(self) -> ProxyUse:
        """How the proxy serves this config's connector."""
        return self.entry.proxy

    @field_validator("prefill", "decode", "aggregated")
    @classmethod
    def _normalize_urls(cls, urls: list[str]) -> list[str]:
        return [normalize_url(u) for u in urls]

    @model_validator(mode="after")
    def _check(self) -> ProxyConfig:
        use, name = self.use, self.connector
        if (use.instances == "aggregated") != bool(self.aggregated):
            raise ValueError("--aggregated instances go with --connector none, and connector none needs them")
        if use.instances == "aggregated":
            if self.prefill or self.decode:
                raise ValueError(
                    f"connector {name} forwards whole requests: give --aggregated URLs, not --prefill/--decode"
                )
        elif use.instances == "registered":
            if self.prefill or self.decode:
                # A URL cannot carry the handshake/notify ports and sizes the flow needs.
                raise ValueError(
                    f"{self.entry.title} instances register themselves: give --expected-prefill/"
                    "--expected-decode instead of --prefill/--decode URLs"
                )
        elif not self.prefill or not self.decode:
            raise ValueError(f"connector {name} needs at least one prefill and one decode URL")
        for setting in use.required:
            if getattr(self, setting) is None:
                raise ValueError(f"connector {name} needs {setting} (--{setting.replace('_', '-')})")
        for setting in sorted(_CONNECTOR_SETTINGS - use.settings):
            if getattr(self, setting) != type(self).model_fields[setting].get_default(call_default_factory=True):
                raise ValueError(f"{setting} only applies to connector {' or '.join(kv_connectors.accepting(setting))}")
        if len(self.bootstrap_ports) > 1 and len(self.bootstrap_ports) != len(self.prefill):
            raise ValueError("give one bootstrap port, or one per prefill URL")
        if self.workers > 1 and use.single_process:
            raise ValueError(f"connector {name} keeps its registrations in one process: workers must be 1")
        return self

    @property
    def want_prefill(self) -> int:
        if self.use.instances == "aggregated":
            return 0
        return self.expected_prefill or max(1, len(self.prefill))

    @property
    def want_decode(self) -> int:
        if self.use.instances == "aggregated":
            return 0
        return self.expected_decode or max(1, len(self.decode))

    @property
    def want_aggregated(self) -> int:
        return self.expected_aggregated or len(self.aggregated)

    def bootstrap_port(self, index: int) -> int:
        if not self.bootstrap_ports:
            assert self.use.bootstrap_port is not None, f"connector {self.connector} has no bootstrap server"
            return self.use.bootstrap_port
        return self.bootstrap_ports[0] if len(self.bootstrap_ports) == 1 else self.bootstrap_ports[index]
