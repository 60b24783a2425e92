"""The bundled connector (connector/, PdbenchConnector): layer-streamed KV over plain TCP.

Every setting is in its kv_connector_extra_config, none in its environment: it dials and binds
the node's address, prefill rank r listens on the worker's KV port + r, and pulls prove the
job's secret. It rejects unknown extra_config keys at start-up, so a recipe is checked against
them before the job queues. Its counters (`connector/stats.py`): `vllm:pdbench_kv_recv_seconds`
once per completed pull on decode; `vllm:pdbench_kv_failed_recv`, `_failed_send`, `_expired`.
The proxy may send decode's leg with prefill's (overlap): decode's pull waits at prefill.
Decode writes each request's load timings (`timings_dir`: the run directory's proxy-timings/,
keyed by the client's X-Pdbench-Id that the proxy passes on) for the per-request TTFT breakdown.
"""

from connector.config import ACCEPTED_KEYS
from harness.kv_connectors.entry import Connector, KvEvidence, Package, PortRange, ProxyUse, Setting, Value

ENTRY = Connector(
    name="pdbench",
    title="the bundled connector",
    summary="the bundled connector/",
    vllm_class="PdbenchConnector",
    module_path="connector",
    extra_config={
        "host": Setting(Value.NODE_ADDR),
        "port": Setting(Value.SIDE_CHANNEL_PORT),
        "secret_file": Setting(Value.SECRET_FILE),
        "timings_dir": Setting(Value.TIMINGS_DIR),
    },
    extra_keys=ACCEPTED_KEYS,
    ports=(PortRange(Value.SIDE_CHANNEL_PORT),),
    # pdbench's own tree (mounted, or installed as the pdbench distribution).
    packages=(Package("pdbench", ("pdbench",), "harness"),),
    proxy=ProxyUse(flow="pdbench", settings=frozenset({"overlap"})),
    evidence=KvEvidence(
        "pdbench",
        received=r"vllm:pdbench_kv_recv_seconds_count",
        failures=r"vllm:pdbench_kv_failed_(recv|send)_total",
        expired=r"vllm:pdbench_kv_expired_total",
        per_request={"vllm:pdbench_kv_recv_seconds_count": 1, "vllm:pdbench_kv_failed_recv_total": 0},
        handoff="connector_records",
        slow_causes=(
            "its TCP socket where CUDA IPC was expected (lane tcp between GPUs of one host: the peer GPU "
            "not visible to decode), small chunks (chunk_bytes), or a wrong NIC between hosts"
        ),
    ),
)
