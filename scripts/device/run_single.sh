#!/usr/bin/env bash
# The reference of the GPU recipes: one vLLM instance alone on the GPU, the same model and
# flags as their servers (no KV connector), driven by pdbench's client with the same prompts
# (shapes, concurrency, counts, seed). No recipe expresses it: an aggregated baseline must use
# as many GPUs as 1P1D (2), and there is one.
#   [SHAPES=4096x64 CONCURRENCY=1] bash scripts/device/run_single.sh RESULTS_DIR [MODEL_DIR]
# Needs vLLM on PATH and pdbench on PYTHONPATH (docs/gpu.md). Serves on port 8300.
set -euo pipefail
out=${1:?usage: run_single.sh RESULTS_DIR [MODEL_DIR]}
model=${2:-.cache/models/llama-8b-shape}
port=8300
mkdir -p "$out"
vllm serve "$model" --port "$port" --served-model-name llama8b --max-model-len 33792 \
  --tensor-parallel-size 1 --load-format dummy --enforce-eager --gpu-memory-utilization 0.45 --kv-cache-memory-bytes 40G \
  >"$out/server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 300); do  # 600 s bound on the start
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "run_single: vLLM exited during start; its log's end:" >&2
    tail -20 "$out/server.log" >&2
    exit 1
  fi
  sleep 2
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "run_single: vLLM not healthy in 600 s" >&2; exit 1; }
timeout 1800 python3 -m harness bench --base-url "http://127.0.0.1:$port" --model llama8b --tokenizer "$model" \
  --results-dir "$out" --shapes "${SHAPES:-1024x64,4096x64,16384x64,32768x64}" --concurrency "${CONCURRENCY:-1,8}" \
  --prompts-multiplier 2 --min-prompts 8 --num-warmups 2 --request-timeout-s 300 --seed 0 \
  --gpus 1 --scrape "single=aggregated@http://127.0.0.1:$port" --server-pid "$pid" \
  --sentinels-dir "$out/sentinels" --metrics-dir "$out/metrics" --progress plain
