"""MoRI-IO (vLLM's MoRIIOConnector): READ (decode pulls) or WRITE (prefill pushes) over RDMA.

Its servers register on the proxy's ZMQ port (proxy_ping_port) with their handshake and notify
ports and DP/TP sizes, which a static URL cannot carry: the proxy waits for the registrations,
keeps them in one process, and shapes each request from them. vLLM's defaults for the handshake
and notify ports (6301, 61005) plus dp_rank + tp_rank would collide for two workers on one node,
so each worker gets its own bases from the topology. vLLM 0.32 keeps no MoRI-IO connector stats:
nothing of its transfers reaches /metrics.
"""

from harness.kv_connectors.entry import Connector, KvEvidence, Package, PortRange, ProxyUse, RouterUse, Setting, Value

ENTRY = Connector(
    name="moriio",
    title="MoRI-IO",
    summary="MoRI-IO",
    vllm_class="MoRIIOConnector",
    extra_config={
        "proxy_ip": Setting(Value.PROXY_ADDR),
        "proxy_ping_port": Setting(Value.PROXY_PING_PORT, text=True),
        "http_port": Setting(Value.HTTP_PORT, text=True),
        "handshake_port": Setting(Value.SIDE_CHANNEL_PORT, text=True),
        "notify_port": Setting(Value.NOTIFY_PORT, text=True),
        "read_mode": Setting(Value.READ_MODE),
    },
    ports=(PortRange(Value.SIDE_CHANNEL_PORT), PortRange(Value.NOTIFY_PORT)),
    rdma=True,
    image_modules=("mori",),
    packages=(Package("mori", ("mori",), "mori"),),
    proxy=ProxyUse(
        flow="moriio",
        instances="registered",
        settings=frozenset({"moriio_host", "moriio_port", "moriio_mode"}),
        required=("moriio_port",),
        single_process=True,
        ports=(Value.PROXY_PING_PORT,),
    ),
    evidence=KvEvidence(
        "moriio",
        None,
        None,
        None,
        "vLLM 0.32 exports no MoRI-IO transfer counters to /metrics (it keeps no connector stats)",
    ),
    vllm_router=RouterUse("moriio", discovery=True),
)
