#!/usr/bin/env bash
# pdbench node script · recipe tiny-fp32-cpu-nixl-1p1d · fingerprint ed7f1a7fa3841623
# Runs on every node of the job (one Slurm task per node).
#   bash server.sh             run this node: `pdbench node` starts, health-gates and
#                              tears down the processes below that belong to this node
#   bash server.sh proc NAME   run one process in the foreground (what `pdbench node` calls)
# PDBENCH_NODE_ADDR and PDBENCH_NODE_<i>_ADDR are set by `pdbench node` once every node
# has reported its address.
set -euo pipefail
RUN_DIR="${RUN_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
export RUN_DIR
PDBENCH_PYTHON="${PDBENCH_PYTHON:-python3}"
export PDBENCH_PYTHON
export HF_HUB_OFFLINE=1

# prefill-0: prefill worker 0 on node 0, port 8100, 1 device(s)
proc_prefill_0() {
  export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y
  export UCX_PROTO_INFO=y
  export VLLM_CPU_KVCACHE_SPACE=1
  export VLLM_ENABLE_V1_MULTIPROCESSING=0
  export PDBENCH_CPU_ENGINE_FORK=1
  export VLLM_NIXL_SIDE_CHANNEL_HOST="${PDBENCH_NODE_ADDR}"
  export VLLM_NIXL_SIDE_CHANNEL_PORT=5600
  export VLLM_CPU_OMP_THREADS_BIND=0
  export OMP_NUM_THREADS=1
  exec vllm serve /opt/pdbench/.cache/models/tiny-llama \
    --port 8100 \
    --served-model-name tiny \
    --max-model-len 4096 \
    --tensor-parallel-size 1 \
    --load-format dummy \
    --dtype float32 \
    --enforce-eager \
    --max-num-seqs 64 \
    --distributed-executor-backend uni \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"cpu","kv_connector_module_path":"connector.nixl_polled","kv_connector_extra_config":{"kv_lease_duration":300}}'
}

# decode-0: decode worker 0 on node 1, port 8200, 1 device(s)
proc_decode_0() {
  export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y
  export UCX_PROTO_INFO=y
  export VLLM_CPU_KVCACHE_SPACE=1
  export VLLM_ENABLE_V1_MULTIPROCESSING=0
  export PDBENCH_CPU_ENGINE_FORK=1
  export VLLM_NIXL_SIDE_CHANNEL_HOST="${PDBENCH_NODE_ADDR}"
  export VLLM_NIXL_SIDE_CHANNEL_PORT=5601
  export VLLM_CPU_OMP_THREADS_BIND=1
  export OMP_NUM_THREADS=1
  exec vllm serve /opt/pdbench/.cache/models/tiny-llama \
    --port 8200 \
    --served-model-name tiny \
    --max-model-len 4096 \
    --tensor-parallel-size 1 \
    --load-format dummy \
    --dtype float32 \
    --enforce-eager \
    --max-num-seqs 64 \
    --distributed-executor-backend uni \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_buffer_device":"cpu","kv_connector_module_path":"connector.nixl_polled","kv_connector_extra_config":{"kv_lease_duration":300}}'
}

# proxy: vllm-router as the PD proxy on node 0, port 30000
proc_proxy() {
  exec "${PDBENCH_PYTHON}" -m vllm_router.launch_router \
    --host 127.0.0.1 \
    --port 30000 \
    --prometheus-host 127.0.0.1 \
    --prometheus-port 29000 \
    --policy round_robin \
    --request-timeout-secs 600 \
    --worker-startup-timeout-secs 420 \
    --worker-startup-check-interval 1 \
    --disable-retries \
    --log-level warning \
    --vllm-pd-disaggregation \
    --kv-connector nixl \
    --prefill "http://${PDBENCH_NODE_0_ADDR}:8100" \
    --decode "http://${PDBENCH_NODE_1_ADDR}:8200"
}

# proxy-arm-pdbench: router arm pdbench (the PD proxy), after the job's own router on node 0, port 30000
proc_proxy_arm_pdbench() {
  exec "${PDBENCH_PYTHON}" -m harness proxy \
    --host 127.0.0.1 \
    --port 30000 \
    --connector nixl \
    --policy round_robin \
    --request-timeout-s 600 \
    --stream-idle-timeout-s 300 \
    --timings-dir "${RUN_DIR}/proxy-timings" \
    --prefill "http://${PDBENCH_NODE_0_ADDR}:8100" \
    --decode "http://${PDBENCH_NODE_1_ADDR}:8200"
}

# bench: benchmark client on node 0, through the proxy
proc_bench() {
  export PDBENCH_CACHE_DIR="${RUN_DIR}/../../.cache"
  exec "${PDBENCH_PYTHON}" -m harness bench \
    --config "${RUN_DIR}/bench.json" \
    --results-dir "${RUN_DIR}" \
    --scrape "prefill-0=prefill@http://${PDBENCH_NODE_0_ADDR}:8100" \
    --scrape "decode-0=decode@http://${PDBENCH_NODE_1_ADDR}:8200"
}

# bench-arm-pdbench: benchmark client on node 0, through router arm pdbench
proc_bench_arm_pdbench() {
  export PDBENCH_CACHE_DIR="${RUN_DIR}/../../.cache"
  exec "${PDBENCH_PYTHON}" -m harness bench \
    --config "${RUN_DIR}/bench-arm-pdbench.json" \
    --results-dir "${RUN_DIR}/arms/pdbench" \
    --scrape "prefill-0=prefill@http://${PDBENCH_NODE_0_ADDR}:8100" \
    --scrape "decode-0=decode@http://${PDBENCH_NODE_1_ADDR}:8200"
}

# The node's own check that pdbench runs here at all; a failure is recorded as the node's
# cause, as `pdbench node` would record its own (it cannot when it cannot start).
check_pdbench() {
  local out
  NODE=${SLURM_NODEID:-0}
  STATE="$RUN_DIR/state"
  mkdir -p "$STATE"
  # Bounded: a checkout on a hung network filesystem must not hang the node.
  if ! out=$(timeout 120 "$PDBENCH_PYTHON" -c 'import harness.node.runtime, vllm_router.launch_router' 2>&1); then
    fail "pdbench cannot run on $(hostname) with PDBENCH_PYTHON=$PDBENCH_PYTHON: $(printf '%s\n' "$out" | last_line /dev/stdin) (pdbench must be installed at the same path on every node: shared storage, or site.pdbench_root)"
  fi
}
json_str() {
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/\\t}; s=${s//$'\r'/}; s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}
# fail CAUSE [LOG]: state/root_cause and state/abort, each written once (ln does not
# replace), so the first cause of the job wins; then exit.
fail() {
  local cause=$1 log=${2:-} tail="" reason tmp
  reason="node $NODE: $cause"
  if [ -n "$log" ]; then
    tail=$(tail -n 15 "$RUN_DIR/$log" 2>/dev/null | cut -c1-400 || true)
    reason="$reason; last lines of $log:"$'\n'"${tail:-  (empty)}"
  fi
  echo "pdbench: $reason" >&2
  mkdir -p "$STATE" 2>/dev/null || true  # a failure before the run's state/ was made
  tmp=$(mktemp "$STATE/.failure-node$NODE.XXXXXX")
  printf '{"node": %s, "cause": %s, "process": null, "role": null, "log": %s, "log_tail": %s, "primary": true, "time": %s, "reason": %s}\n' \
    "$NODE" "$(json_str "$cause")" "$( [ -n "$log" ] && json_str "$log" || echo null)" \
    "$( [ -n "$log" ] && json_str "$tail" || echo null)" "$(date +%s.%N)" "$(json_str "$reason")" >"$tmp"
  ln "$tmp" "$STATE/root_cause" 2>/dev/null || true
  ln "$tmp" "$STATE/abort" 2>/dev/null || true
  rm -f "$tmp"
  exit 1
}
# last_line FILE: the last non-empty line of FILE, cut for a one-line cause.
last_line() { grep -v '^\s*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-300; }

case "${1:-node}" in
  node) check_pdbench; exec "$PDBENCH_PYTHON" -m harness node --run-dir "$RUN_DIR" ;;
  proc)
    case "${2:-}" in
      prefill-0) proc_prefill_0 ;;
      decode-0) proc_decode_0 ;;
      proxy) proc_proxy ;;
      proxy-arm-pdbench) proc_proxy_arm_pdbench ;;
      bench) proc_bench ;;
      bench-arm-pdbench) proc_bench_arm_pdbench ;;
      *) echo "server.sh: unknown process '${2:-}'" >&2; exit 2 ;;
    esac
    ;;
  *) echo "usage: server.sh [node | proc NAME]" >&2; exit 2 ;;
esac
