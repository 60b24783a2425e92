"""The shape of one connector's entry: what pdbench knows about a KV connector, as data.

Each connector module (nixl.py, moriio.py, ...) holds one `Connector`; the consumers read its
fields instead of branching on its name: render (vLLM's kv-transfer-config, environment, proxy
line, pre-flight ports and RDMA), config (the names a recipe accepts), the proxy (its flow and
settings), validity (the KV counters) and the node's package probe. Values that only render or
the job know (a node's address, a worker's ports) are named by `Value`, which render resolves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

Role = Literal["prefill", "decode"]


class Value(Enum):
    """A value of the job, resolved by render for one worker (a port, or a shell expansion)."""

    NODE_ADDR = "node_addr"  # the worker's node, known only inside the job
    PROXY_ADDR = "proxy_addr"  # node 0, where the proxy runs
    SECRET_FILE = "secret_file"  # the job's KV secret in the run directory
    TIMINGS_DIR = "timings_dir"  # the run directory's per-request timings (proxy and connector)
    HTTP_PORT = "http_port"  # the worker's vLLM HTTP port
    SIDE_CHANNEL_PORT = "side_channel_port"  # the worker's base of connector.side_channel_port's range
    NOTIFY_PORT = "notify_port"  # the worker's base of connector.notify_port's range
    PROXY_PING_PORT = "proxy_ping_port"  # connector.proxy_ping_port
    READ_MODE = "read_mode"  # connector.read_mode: true, or the key is left out


@dataclass(frozen=True)
class Setting:
    """One key of kv_connector_extra_config or one environment variable, from a job value."""

    value: Value
    text: bool = False  # as a string (vLLM's MoRI-IO reads its ports as strings)


@dataclass(frozen=True)
class EnvVar:
    name: str
    setting: Setting
    roles: tuple[Role, ...] = ("prefill", "decode")
    # `pdbench nic` sets it on the node when topology.nic_detection is on.
    set_by_nic_detection: bool = False


@dataclass(frozen=True)
class PortRange:
    """Ports a worker binds on each of its nodes, which pre-flight checks are free."""

    base: Value
    per_rank: bool = True  # one port per rank on the node; else one port, on the HTTP leader only
    roles: tuple[Role, ...] = ("prefill", "decode")
    # Only when the role's kv_transfer is on (Mooncake's bootstrap port is set either way).
    with_kv_transfer: bool = True


@dataclass(frozen=True)
class Package:
    """A distribution recorded beside every result: the record's key, its distribution names
    (tried in order), its import name."""

    key: str
    distributions: tuple[str, ...]
    module: str


@dataclass(frozen=True)
class KvEvidence:
    """The connector's transfer counters on /metrics (family-name patterns, full match); None:
    not exported. Counters are matched by their `_total` series, never `_created`."""

    connector: str
    received: str | None  # on `counted_on`: one count per completed KV transfer
    failures: str | None  # failed transfers, notifications or receives (either role)
    expired: str | None  # KV held by prefill that expired unread (either role)
    missing: str = ""  # what the connector does not export, for the rules' details
    # The role whose servers count the completed transfers (`received`, the handoff's histograms)
    # and whose log holds UCX's account of the KV's lane: the side that drives each transfer and
    # sees it complete. Decode for a pull (it reads); prefill for a push (it writes, and decode's
    # own transfer counters stay at zero).
    counted_on: Role = "decode"
    # What one `counted_on` server exports per completed request, series by series (`name{labels}`):
    # the contract the patterns above read, which the validity tests replay for every entry.
    per_request: Mapping[str, float] = field(default_factory=dict)
    # Where a point's KV handoff (bytes, time and rate per transfer, the lane) is read from
    # (harness.validity.kv_handoff): the connector's per-request lines in the timings directory,
    # vLLM's NIXL histograms on `counted_on`, or nowhere (the connector exports no sizes or times).
    handoff: Literal["connector_records", "vllm_nixl_metrics"] | None = None
    # The start of UCX's name for the operation that moves the KV, as UCX_PROTO_INFO prints it in
    # `counted_on`'s log (harness.validity.ucx_lanes); "" where UCX does not carry the KV.
    ucx_operation: str = ""
    # What usually makes this connector's KV move far below its path's ceiling: the reason a
    # degraded_transport verdict gives (harness.validity.kv_transport).
    slow_causes: str = "a wrong NIC or transport for the path"


Instances = Literal["static", "registered", "aggregated"]


@dataclass(frozen=True)
class ProxyUse:
    """How `pdbench proxy` serves this connector."""

    flow: str  # a key of harness.proxy.flows.FLOWS
    # static: --prefill/--decode URLs; registered: instances register on the proxy's port;
    # aggregated: whole requests to --aggregated URLs (no KV connector).
    instances: Instances = "static"
    # ProxyConfig fields that apply only to connectors listing them, and those required here.
    settings: frozenset[str] = frozenset()
    required: tuple[str, ...] = ()
    # Its instances live in one process's memory (registrations): no --workers.
    single_process: bool = False
    # Decode pulls from each prefill's bootstrap server, on this port unless the proxy is told
    # otherwise; the proxy asks it for the engine ids. None: no bootstrap server.
    bootstrap_port: int | None = None
    # Ports the proxy's node binds for this connector, besides the proxy's HTTP port.
    ports: tuple[Value, ...] = ()


@dataclass(frozen=True)
class RouterUse:
    """How vllm-router (proxy.kind: vllm-router) serves this connector: its `--kv-connector`
    value, and whether the workers register on its ZMQ discovery address (MoRI-IO) instead of
    being named by URL."""

    kv_connector: Literal["nixl", "mooncake", "moriio"]
    discovery: bool = False


@dataclass(frozen=True)
class Connector:
    name: str
    title: str  # as prose names it: "MoRI-IO"
    summary: str  # shown after the name in help texts, e.g. "MoRI-IO"; "" for none
    proxy: ProxyUse
    # vLLM's kv_connector class; None: no KV connector (aggregated servers).
    vllm_class: str | None = None
    module_path: str | None = None  # kv_connector_module_path, for a connector outside vLLM
    # kv_connector_module_path of the same class built without NIXL's progress thread (recipe
    # connector.progress_thread: false); None: the connector has no such thread to turn off.
    without_progress_thread: str | None = None
    # kv_connector_extra_config defaults, the recipe's extra_config winning.
    extra_config: Mapping[str, Setting] = field(default_factory=dict)
    # The extra_config keys the connector accepts (None: any; it checks them itself).
    extra_keys: tuple[str, ...] | None = None
    env: tuple[EnvVar, ...] = ()
    # Constant environment of its prefill and decode servers that the model's or the recipe's
    # env may override (a transport setting the connector needs on most machines).
    env_defaults: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[PortRange, ...] = ()
    rdma: bool = False  # KV moves over RDMA on GPU nodes: pre-flight checks the NICs
    image_modules: tuple[str, ...] = ()  # importable in the image besides vLLM
    packages: tuple[Package, ...] = ()  # versions recorded with every result
    evidence: KvEvidence | None = None  # None: no KV moves (aggregated)
    # None: vllm-router has no flow for it (the bundled connector's runs only in pdbench's proxy).
    vllm_router: RouterUse | None = None

    @property
    def moves_kv(self) -> bool:
        return self.vllm_class is not None
