"""NIXL (vLLM's NixlConnector): decode pulls prefill's KV over UCX (RDMA on GPU nodes).

Each worker's ranks listen on a side channel (VLLM_NIXL_SIDE_CHANNEL_PORT + rank) for the
handshake. Its counters (vLLM 0.32 `nixl/stats.py`, `NixlPromMetrics`): decode observes
`vllm:nixl_xfer_time_seconds` once per completed read; `vllm:nixl_num_failed_transfers`,
`vllm:nixl_num_failed_notifications`, and on prefill `vllm:nixl_num_kv_expired_reqs`,
`vllm:nixl_num_notifications_after_expiry`.
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
    name="nixl",
    title="NIXL",
    summary="",
    vllm_class="NixlConnector",
    without_progress_thread="connector.nixl_polled",
    env=(
        EnvVar("VLLM_NIXL_SIDE_CHANNEL_HOST", Setting(Value.NODE_ADDR), set_by_nic_detection=True),
        EnvVar("VLLM_NIXL_SIDE_CHANNEL_PORT", Setting(Value.SIDE_CHANNEL_PORT, text=True)),
    ),
    # UCX's cuda_ipc turns its get (NIXL's pull) off when NVML reports no NVLink, as for two
    # servers on one GPU, and then reads by software emulation over TCP: 0.35 GB/s against
    # 59-233 GB/s with it on (docs/gpu.md, one H200). Harmless between hosts (no cuda_ipc there).
    # UCX_PROTO_INFO: UCX prints the protocol and transport it selected for each operation into the
    # server's log (a table per endpoint configuration, once): the KV's lane, proven
    # (harness.validity.ucx_lanes), where vLLM's metrics cannot say it.
    env_defaults={"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y", "UCX_PROTO_INFO": "y"},
    ports=(PortRange(Value.SIDE_CHANNEL_PORT),),
    rdma=True,
    image_modules=("nixl",),
    packages=(Package("nixl", ("nixl", "nixl-cu12", "nixl-cu13"), "nixl"),),
    # Two phases: prefill answers with kv_transfer_params, which decode gets.
    proxy=ProxyUse(flow="two_phase"),
    evidence=KvEvidence(
        "nixl",
        received=r"vllm:nixl_xfer_time_seconds_count",
        failures=r"vllm:nixl_num_failed_(transfers|notifications)_total",
        expired=r"vllm:nixl_num_(kv_expired_reqs|notifications_after_expiry)_total",
        per_request={
            "vllm:nixl_xfer_time_seconds_count": 1,
            "vllm:nixl_num_failed_transfers_total": 0,
            "vllm:nixl_num_failed_notifications_total": 0,
        },
        handoff="vllm_nixl_metrics",
        # UCX's ucp_operation_descs[UCP_OP_ID_GET]: decode's reads of prefill's blocks. Only the KV
        # is read between the servers (the real logs in tests/data/ucx_proto_info), so any
        # attribute suffix counts.
        ucx_operation="remote memory read by ucp_get*",
        slow_causes=(
            "UCX without a GPU transport (UCX_TLS without cuda_ipc; on one GPU without NVLink cuda_ipc's "
            "get is off unless UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y), a pull where push (nixlpush) is faster, one descriptor "
            "per block (small block size, a wrapped block pool: see bytes per descriptor), or a wrong NIC"
        ),
    ),
    vllm_router=RouterUse("nixl"),
)
