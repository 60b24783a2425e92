"""NIXL push (vLLM's NixlPushConnector, vLLM >= 0.24.0): prefill WRITEs its KV into decode's blocks.

Everything but the direction is NIXL's (nixl.py): the same side channel, environment, ports,
packages, and the same two-phase proxy flow. Prefill answers its leg with kv_transfer_params;
decode's scheduler registers the blocks it allocated with prefill (a NIXL notification, no
network call of its own), and prefill's `nixl-push-writer` thread matches the registration to
its finished request by request id (exact, then with vLLM's random `-<8 hex>` suffix stripped:
both legs must carry one X-Request-Id, as pdbench's proxy and vllm-router send them) and WRITEs.
kv_role must be kv_producer / kv_consumer (vLLM refuses kv_both), as render sets it for NIXL.

Counters (vLLM 0.32 `nixl/push_worker.py`, `nixl/stats.py`): prefill's worker polls its WRITE
handles (`_pop_done_transfers(self._sending_transfers)`) and records each completed one, so the
`vllm:nixl_xfer_time_seconds`, `_post_time_seconds`, `_bytes_transferred`, `_num_descriptors`
histograms grow on prefill's /metrics, one observation per WRITE: one per decode rank written per
prefill rank, so at least one per request. Decode materialises an empty transfer for each
completed push, and its histograms stay at zero. Prefill counts failed WRITE submissions and
states (`vllm:nixl_num_failed_transfers`) and expired leases (`_kv_expired_reqs`); decode counts
failed registrations (`vllm:nixl_num_failed_notifications`, also in `_failed_transfers`) and
completion notifications that arrive after its request is gone (`_notifications_after_expiry`).
Decode's registration watchdog (extra_config `push_registration_timeout`, default
`decoder_kv_blocks_ttl`, 480 s) only logs a warning and drops the registration: it counts
nothing, and decode's request waits on (the client's request timeout ends it).
"""

from dataclasses import replace

from harness.kv_connectors import nixl

_PULL = nixl.ENTRY.evidence
assert _PULL is not None

# The pull's environment is kept whole: UCX_CUDA_IPC_ENABLE_GET_ZCOPY only concerns gets (cuda_ipc
# has no such switch for puts), and UCX_PROTO_INFO prints the write's lane in prefill's log.
ENTRY = replace(
    nixl.ENTRY,
    name="nixlpush",
    title="NIXL push",
    summary="NIXL push, vLLM >= 0.24.0",
    vllm_class="NixlPushConnector",
    without_progress_thread="connector.nixl_polled",
    evidence=replace(
        _PULL,
        connector="nixlpush",
        counted_on="prefill",
        # One WRITE per request where both sides have one rank; the failure counters are prefill's.
        per_request={
            "vllm:nixl_xfer_time_seconds_count": 1,
            "vllm:nixl_num_failed_transfers_total": 0,
            "vllm:nixl_num_failed_notifications_total": 0,
        },
        # UCX's ucp_operation_descs[UCP_OP_ID_PUT] with the "(multi)" attribute that NIXL's UCX
        # backend posts every write with (nixlUcxEp::write: UCP_OP_ATTR_FLAG_MULTI_SEND). UCX's own
        # puts between the servers carry none: a real NIXL log holds "from host memory to host"
        # and "software emulation" puts during connection set-up that are not the KV.
        ucx_operation="remote memory write by ucp_put*(multi)",
        slow_causes=(
            "UCX without a GPU transport (UCX_TLS without cuda_ipc or an RDMA transport: the write is "
            "emulated by messages), one descriptor per block (small block size, a wrapped block pool: see "
            "bytes per descriptor), prefill's writer thread starved of CPU, or a wrong NIC"
        ),
    ),
)
