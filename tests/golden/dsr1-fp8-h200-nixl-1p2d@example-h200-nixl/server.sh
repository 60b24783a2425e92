#!/usr/bin/env bash
# pdbench node script · recipe dsr1-fp8-h200-nixl-1p2d · fingerprint c337bbf56ba32204
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
export HF_HUB_CACHE=/lustre/shared/hf-cache
export HF_HUB_OFFLINE=1
export IBDEVICES=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7

# prefill-0: prefill worker 0 on node 0, port 8100, 8 device(s)
proc_prefill_0() {
  # RDMA devices, GID index and QoS of this node (TCP settings when there is no RDMA).
  # Assigned first, so that a failing detection fails the node (set -e) instead of
  # leaving UCX/NCCL on their defaults.
  local nic_env
  nic_env=$("$PDBENCH_PYTHON" -m harness nic --export --fallback-addr "${PDBENCH_NODE_ADDR}")
  eval "$nic_env"
  export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y
  export UCX_PROTO_INFO=y
  export VLLM_ENGINE_READY_TIMEOUT_S=3600
  export IBDEVICES=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
  export VLLM_NIXL_SIDE_CHANNEL_PORT=5600
  exec vllm serve deepseek-ai/DeepSeek-R1-0528 \
    --port 8100 \
    --served-model-name deepseek-r1-0528-fp8-nvidia \
    --max-model-len 10240 \
    --tensor-parallel-size 8 \
    --enable-expert-parallel \
    --trust-remote-code \
    --gpu-memory-utilization 0.85 \
    --kv-cache-dtype fp8 \
    --max-num-batched-tokens 32768 \
    --max-num-seqs 16 \
    --block-size 256 \
    --no-enable-prefix-caching \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"cuda","kv_load_failure_policy":"fail"}'
}

# decode-0: decode worker 0 on node 1, port 8200, 8 device(s)
proc_decode_0() {
  # RDMA devices, GID index and QoS of this node (TCP settings when there is no RDMA).
  # Assigned first, so that a failing detection fails the node (set -e) instead of
  # leaving UCX/NCCL on their defaults.
  local nic_env
  nic_env=$("$PDBENCH_PYTHON" -m harness nic --export --fallback-addr "${PDBENCH_NODE_ADDR}")
  eval "$nic_env"
  export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y
  export UCX_PROTO_INFO=y
  export VLLM_ENGINE_READY_TIMEOUT_S=3600
  export IBDEVICES=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
  export VLLM_NIXL_SIDE_CHANNEL_PORT=5608
  exec vllm serve deepseek-ai/DeepSeek-R1-0528 \
    --port 8200 \
    --served-model-name deepseek-r1-0528-fp8-nvidia \
    --max-model-len 10240 \
    --tensor-parallel-size 8 \
    --enable-expert-parallel \
    --trust-remote-code \
    --gpu-memory-utilization 0.9 \
    --kv-cache-dtype fp8 \
    --max-num-batched-tokens 256 \
    --max-num-seqs 256 \
    --block-size 256 \
    --no-enable-prefix-caching \
    --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}' \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_buffer_device":"cuda","kv_load_failure_policy":"fail"}'
}

# decode-1: decode worker 1 on node 2, port 8200, 8 device(s)
proc_decode_1() {
  # RDMA devices, GID index and QoS of this node (TCP settings when there is no RDMA).
  # Assigned first, so that a failing detection fails the node (set -e) instead of
  # leaving UCX/NCCL on their defaults.
  local nic_env
  nic_env=$("$PDBENCH_PYTHON" -m harness nic --export --fallback-addr "${PDBENCH_NODE_ADDR}")
  eval "$nic_env"
  export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y
  export UCX_PROTO_INFO=y
  export VLLM_ENGINE_READY_TIMEOUT_S=3600
  export IBDEVICES=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
  export VLLM_NIXL_SIDE_CHANNEL_PORT=5616
  exec vllm serve deepseek-ai/DeepSeek-R1-0528 \
    --port 8200 \
    --served-model-name deepseek-r1-0528-fp8-nvidia \
    --max-model-len 10240 \
    --tensor-parallel-size 8 \
    --enable-expert-parallel \
    --trust-remote-code \
    --gpu-memory-utilization 0.9 \
    --kv-cache-dtype fp8 \
    --max-num-batched-tokens 256 \
    --max-num-seqs 256 \
    --block-size 256 \
    --no-enable-prefix-caching \
    --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}' \
    --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_buffer_device":"cuda","kv_load_failure_policy":"fail"}'
}

# proxy: PD proxy on node 0, port 30000
proc_proxy() {
  exec "${PDBENCH_PYTHON}" -m harness proxy \
    --host 127.0.0.1 \
    --port 30000 \
    --connector nixl \
    --policy round_robin \
    --request-timeout-s 600 \
    --stream-idle-timeout-s 300 \
    --timings-dir "${RUN_DIR}/proxy-timings" \
    --prefill "http://${PDBENCH_NODE_0_ADDR}:8100" \
    --decode "http://${PDBENCH_NODE_1_ADDR}:8200" \
    --decode "http://${PDBENCH_NODE_2_ADDR}:8200"
}

# aggregated-0: aggregated worker 0 on node 0, port 8300, 8 device(s)
proc_aggregated_0() {
  # RDMA devices, GID index and QoS of this node (TCP settings when there is no RDMA).
  # Assigned first, so that a failing detection fails the node (set -e) instead of
  # leaving UCX/NCCL on their defaults.
  local nic_env
  nic_env=$("$PDBENCH_PYTHON" -m harness nic --export --fallback-addr "${PDBENCH_NODE_ADDR}")
  eval "$nic_env"
  export VLLM_ENGINE_READY_TIMEOUT_S=3600
  export IBDEVICES=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
  exec vllm serve deepseek-ai/DeepSeek-R1-0528 \
    --port 8300 \
    --served-model-name deepseek-r1-0528-fp8-nvidia \
    --max-model-len 10240 \
    --tensor-parallel-size 8 \
    --enable-expert-parallel \
    --trust-remote-code \
    --kv-cache-dtype fp8 \
    --compilation-config '{"pass_config":{"fuse_allreduce_rms":true,"eliminate_noops":true}}' \
    --no-enable-prefix-caching \
    --max-cudagraph-capture-size 2048 \
    --max-num-batched-tokens 8192 \
    --gpu-memory-utilization 0.9 \
    --max-num-seqs 256
}

# aggregated-1: aggregated worker 1 on node 1, port 8300, 8 device(s)
proc_aggregated_1() {
  # RDMA devices, GID index and QoS of this node (TCP settings when there is no RDMA).
  # Assigned first, so that a failing detection fails the node (set -e) instead of
  # leaving UCX/NCCL on their defaults.
  local nic_env
  nic_env=$("$PDBENCH_PYTHON" -m harness nic --export --fallback-addr "${PDBENCH_NODE_ADDR}")
  eval "$nic_env"
  export VLLM_ENGINE_READY_TIMEOUT_S=3600
  export IBDEVICES=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
  exec vllm serve deepseek-ai/DeepSeek-R1-0528 \
    --port 8300 \
    --served-model-name deepseek-r1-0528-fp8-nvidia \
    --max-model-len 10240 \
    --tensor-parallel-size 8 \
    --enable-expert-parallel \
    --trust-remote-code \
    --kv-cache-dtype fp8 \
    --compilation-config '{"pass_config":{"fuse_allreduce_rms":true,"eliminate_noops":true}}' \
    --no-enable-prefix-caching \
    --max-cudagraph-capture-size 2048 \
    --max-num-batched-tokens 8192 \
    --gpu-memory-utilization 0.9 \
    --max-num-seqs 256
}

# aggregated-2: aggregated worker 2 on node 2, port 8300, 8 device(s)
proc_aggregated_2() {
  # RDMA devices, GID index and QoS of this node (TCP settings when there is no RDMA).
  # Assigned first, so that a failing detection fails the node (set -e) instead of
  # leaving UCX/NCCL on their defaults.
  local nic_env
  nic_env=$("$PDBENCH_PYTHON" -m harness nic --export --fallback-addr "${PDBENCH_NODE_ADDR}")
  eval "$nic_env"
  export VLLM_ENGINE_READY_TIMEOUT_S=3600
  export IBDEVICES=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
  exec vllm serve deepseek-ai/DeepSeek-R1-0528 \
    --port 8300 \
    --served-model-name deepseek-r1-0528-fp8-nvidia \
    --max-model-len 10240 \
    --tensor-parallel-size 8 \
    --enable-expert-parallel \
    --trust-remote-code \
    --kv-cache-dtype fp8 \
    --compilation-config '{"pass_config":{"fuse_allreduce_rms":true,"eliminate_noops":true}}' \
    --no-enable-prefix-caching \
    --max-cudagraph-capture-size 2048 \
    --max-num-batched-tokens 8192 \
    --gpu-memory-utilization 0.9 \
    --max-num-seqs 256
}

# proxy-aggregated: proxy of the aggregated baseline on node 0, port 30000
proc_proxy_aggregated() {
  exec "${PDBENCH_PYTHON}" -m harness proxy \
    --host 127.0.0.1 \
    --port 30000 \
    --connector none \
    --policy round_robin \
    --request-timeout-s 600 \
    --stream-idle-timeout-s 300 \
    --timings-dir "${RUN_DIR}/proxy-timings" \
    --aggregated "http://${PDBENCH_NODE_0_ADDR}:8300" \
    --aggregated "http://${PDBENCH_NODE_1_ADDR}:8300" \
    --aggregated "http://${PDBENCH_NODE_2_ADDR}:8300"
}

# bench: benchmark client on node 0, through the proxy
proc_bench() {
  export PDBENCH_CACHE_DIR="${RUN_DIR}/../../.cache"
  exec "${PDBENCH_PYTHON}" -m harness bench \
    --config "${RUN_DIR}/bench.json" \
    --results-dir "${RUN_DIR}" \
    --scrape "prefill-0=prefill@http://${PDBENCH_NODE_0_ADDR}:8100" \
    --scrape "decode-0=decode@http://${PDBENCH_NODE_1_ADDR}:8200" \
    --scrape "decode-1=decode@http://${PDBENCH_NODE_2_ADDR}:8200"
}

# bench-aggregated: benchmark client on node 0, through the aggregated baseline's proxy
proc_bench_aggregated() {
  export PDBENCH_CACHE_DIR="${RUN_DIR}/../../.cache"
  exec "${PDBENCH_PYTHON}" -m harness bench \
    --config "${RUN_DIR}/bench-aggregated.json" \
    --results-dir "${RUN_DIR}" \
    --scrape "aggregated-0=aggregated@http://${PDBENCH_NODE_0_ADDR}:8300" \
    --scrape "aggregated-1=aggregated@http://${PDBENCH_NODE_1_ADDR}:8300" \
    --scrape "aggregated-2=aggregated@http://${PDBENCH_NODE_2_ADDR}:8300"
}

# The node's own check that pdbench runs here at all; a failure is recorded as the node's
# cause, as `pdbench node` would record its own (it cannot when it cannot start).
check_pdbench() {
  local out
  NODE=${SLURM_NODEID:-0}
  STATE="$RUN_DIR/state"
  mkdir -p "$STATE"
  # Bounded: a checkout on a hung network filesystem must not hang the node.
  if ! out=$(timeout 120 "$PDBENCH_PYTHON" -c 'import harness.node.runtime' 2>&1); then
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
      decode-1) proc_decode_1 ;;
      proxy) proc_proxy ;;
      aggregated-0) proc_aggregated_0 ;;
      aggregated-1) proc_aggregated_1 ;;
      aggregated-2) proc_aggregated_2 ;;
      proxy-aggregated) proc_proxy_aggregated ;;
      bench) proc_bench ;;
      bench-aggregated) proc_bench_aggregated ;;
      *) echo "server.sh: unknown process '${2:-}'" >&2; exit 2 ;;
    esac
    ;;
  *) echo "usage: server.sh [node | proc NAME]" >&2; exit 2 ;;
esac
