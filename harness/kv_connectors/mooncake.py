"""Mooncake (vLLM's MooncakeConnector): decode pulls from each prefill's bootstrap server.

The proxy gives both legs one transfer id and decode the prefill's bootstrap address
(VLLM_MOONCAKE_BOOTSTRAP_PORT, on the prefill's HTTP leader), so the legs run at once; it asks
the bootstrap server for the engine id of each DP rank before it calls a prefill ready.
`MooncakeKVConnectorStats` records transfers and failures, but vLLM 0.32 has no
`build_prom_metrics` for it ("TODO(mooncake-stats)"): nothing reaches /metrics.
"""

from harness.kv_connectors.entry import (
    Connector,
    EnvVar,
    KvEvidence,
    Package,
    PortRange,
    ProxyUse,
    RouterUse,
    Setting,
    Value,
)

ENTRY = Connector(
    name="mooncake",
    title="Mooncake",
    summary="",
    vllm_class="MooncakeConnector",
    env=(EnvVar("VLLM_MOONCAKE_BOOTSTRAP_PORT", Setting(Value.SIDE_CHANNEL_PORT, text=True), roles=("prefill",)),),
    ports=(PortRange(Value.SIDE_CHANNEL_PORT, per_rank=False, roles=("prefill",), with_kv_transfer=False),),
    rdma=True,
    image_modules=("mooncake.engine",),
    # The CPU build (scripts/setup_mooncake.sh) is another distribution of the same module.
    packages=(
        Package(
            "mooncake-transfer-engine",
            ("mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda"),
            "mooncake",
        ),
    ),
    # vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default.
    proxy=ProxyUse(flow="mooncake", settings=frozenset({"bootstrap_ports"}), bootstrap_port=8998),
    evidence=KvEvidence(
        "mooncake",
        None,
        None,
        None,
        "vLLM 0.32 exports no Mooncake transfer counters to /metrics (its stats have no build_prom_metrics)",
    ),
    vllm_router=RouterUse("mooncake"),
)
