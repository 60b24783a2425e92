#!/usr/bin/env bash
# On the GPU machine, after stage_device.py install: the measurements of docs/gpu.md, one job
# after another.
#   bash scripts/device/run_all.sh RESULTS_ROOT [STEP...]    (default: pdbench nixl single)
# One H200: pdbench, nixl (1P1D on the one GPU). Two H200s (nvidia-h200-x2): x2-pdbench,
# x2-nixl (1P1D, prefill GPU 0 -> decode GPU 1; x2-nixl then runs its 2-replica baseline),
# x2-nixl-b64 (1P1D, KV block size 64), x2-pdbench-grid (bundled 1P1D, then two replicas on the
# same GPUs behind the proxy: ISL 1k-32k x c 1-64, issue 44's table), x2-nixl-tcp (UCX_TLS without a GPU transport: the
# degraded_transport verdict's case), x2-kv-arms (NIXL pull and push, blocks 16 and 64, 1P1D at
# c=1; push needs vLLM >= 0.24: stage_build.py --vllm 0.26.0). single: one instance on GPU 0, every recipe's reference.
# predict-single: that instance profiled, then measured where it was not, predicted before it ran;
# predict-known-single the same with the DeepSeek-shaped known-answer model; predict-x2: NIXL 1P1D's
# profile on two H200s, one job of three prompt lengths (held out afterwards).
# dsr1-shape-pdbench, dsr1-shape-nixl, dsr1-shape-agg: the same three on one H200 with the DeepSeek-V3-shaped
# model (build it first: make_model.py --shape dsr1-shape, and carry .cache/models/dsr1-shape).
# dsr1-shape-x4-{nixl,pdbench}-{1p2d,1p1d-wideep}: the four-H200 recipes (nvidia-h200-x4).
# dsr1-shape-x2, dsr1-shape-weights-x2: the two-H200 recipe (prefill TP2+EP2 -> decode TP1) on
# dummy weights and on init-scale ones (dsr1-shape-weights draws those first, on the GPU).
# dsr1-shape-known writes the known-answer weights (on the GPU); known-{pdbench,nixl,agg} (one
# H200), known-x2[-nixl] (two) and known-x4-{nixl,pdbench}-{1p2d,1p1d-wideep} (four) serve them;
# known-nixl-8k repeats the one point NIXL's prefill died at on one H200.
# SUBMIT_SET adds one --set to every submit. Each job's exit status is printed; a failed one
# does not stop the next.
set -uo pipefail
root=${1:?usage: run_all.sh RESULTS_ROOT [STEP...]}; shift
# A run directory is deeper than the 16 levels a device call brings back from $OUT, and $OUT is
# emptied before the next call: results written there are lost (2026-12-01, docs/gpu.md).
if [[ -n ${OUT:-} && $(realpath -m "$root")/ == "$(realpath -m "$OUT")"/* ]]; then
  echo "run_all: RESULTS_ROOT $root is under \$OUT; write under /tmp and tar it into \$OUT in the same call" >&2
  exit 2
fi
steps=${*:-pdbench nixl single}
export PYTHONPATH="/tmp/pdbench-site:$PWD" PATH="/tmp/pdbench-site/bin:$PATH" PYTHONUNBUFFERED=1
mkdir -p "$root"
for step in $steps; do
  echo "run_all: $step starts at $(date -u +%T)"
  case $step in
    pdbench | nixl)
      timeout 3300 python3 -m harness submit --recipe "llama8b-shape-bf16-h200x1-$step-1p1d" --launcher local \
        --results-dir "$root" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    x2-pdbench | x2-nixl)
      timeout 3300 python3 -m harness submit --recipe "llama8b-shape-bf16-h200x2-${step#x2-}-1p1d" --launcher local \
        --results-dir "$root" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    x2-nixl-b64)
      b64='{gpu-memory-utilization: 0.85, block-size: 64}'
      timeout 3300 python3 -m harness submit --recipe llama8b-shape-bf16-h200x2-nixl-1p1d --launcher local --results-dir "$root" \
        --set topology.aggregated=null --set "topology.prefill.flags=$b64" --set "topology.decode.flags=$b64" \
        ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    x2-pdbench-grid)
      replicas='{nodes: 1, workers: 2, port: 8300, flags: {gpu-memory-utilization: 0.85}}'
      timeout 3300 python3 -m harness submit --recipe llama8b-shape-bf16-h200x2-pdbench-1p1d --launcher local \
        --results-dir "$root" --set "topology.aggregated=$replicas" --set 'benchmark.concurrency=[1, 8, 32, 64]' \
        ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    x2-nixl-tcp)
      timeout 1200 python3 -m harness submit --recipe llama8b-shape-bf16-h200x2-nixl-1p1d --launcher local --results-dir "$root" \
        --set topology.aggregated=null --set 'env={UCX_TLS: "tcp,cuda_copy,sm,self"}' \
        --set 'benchmark.shapes=[{isl: 4096, osl: 64}]' --set 'benchmark.concurrency=[1]' \
        ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    x2-kv-arms)
      # NIXL's arms on the same two GPUs (vLLM >= 0.24 for push): pull and push, KV blocks of 16
      # and 64 tokens, ISL 1k-32k at c=1, 1P1D only: issue 43's table. Each job's status is printed.
      for connector in nixl nixlpush; do
        for block in 16 64; do
          flags="{gpu-memory-utilization: 0.85, block-size: $block}"
          timeout 1500 python3 -m harness submit --recipe "llama8b-shape-bf16-h200x2-$connector-1p1d" --launcher local \
            --results-dir "$root" --set topology.aggregated=null --set 'benchmark.concurrency=[1]' \
            --set "topology.prefill.flags=$flags" --set "topology.decode.flags=$flags" ${SUBMIT_SET:+--set "$SUBMIT_SET"}
          echo "run_all: x2-kv-arms $connector block $block exited $? at $(date -u +%T)"
        done
      done ;;
    single)
      timeout 3300 python3 -m harness submit --recipe llama8b-shape-bf16-h200x1-none-agg --launcher local \
        --results-dir "$root" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    predict-single | predict-known-single)
      # Predicted before it runs: the single instance measured at ISL 1k/4k (the profile), then at
      # concurrencies and a prompt length that run never measured, each point predicted by submit
      # from the first run (prediction.json; every result keeps metadata.prediction).
      # predict-known-single: the same with the DeepSeek-shaped known-answer model (MLA, MoE, FP8;
      # build it first: step dsr1-shape-known), OSL 256 as issue 47's table.
      recipe=llama8b-shape-bf16-h200x1-none-agg model=() osl=128 ladder='1, 2, 4, 8, 16, 32, 64' held='3, 6, 12, 24, 48'
      if [[ $step == predict-known-single ]]; then
        recipe=dsr1-shape-fp8-h200x1-none-agg model=(--set model=dsr1-shape-known) osl=256
        ladder='1, 2, 4, 8, 16, 32' held='3, 6, 12, 24'
      fi
      many=(--set benchmark.prompts_multiplier=4 --set benchmark.min_prompts=16)
      timeout 1500 python3 -m harness submit --recipe "$recipe" --launcher local --results-dir "$root/$step" \
        --no-predict "${model[@]}" "${many[@]}" --set "benchmark.shapes=[{isl: 1024, osl: $osl}, {isl: 4096, osl: $osl}]" \
        --set "benchmark.concurrency=[$ladder]" \
        ${SUBMIT_SET:+--set "$SUBMIT_SET"}
      echo "run_all: $step's profile run exited $? at $(date -u +%T)"
      timeout 1500 python3 -m harness submit --recipe "$recipe" --launcher local --results-dir "$root/$step" \
        "${model[@]}" "${many[@]}" --set "benchmark.shapes=[{isl: 1024, osl: $osl}, {isl: 2048, osl: $osl}]" \
        --set "benchmark.concurrency=[$held]" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    predict-x2)
      # The disaggregated profile on two H200s: NIXL 1P1D (prefill GPU 0 -> decode GPU 1), ISL
      # 1k/2k/4k x c 1-32 in one job (one start-up: the device time is short). Held out afterwards
      # by shape (fit on 1k/4k, predict 2k) and point by point (docs/predict.md).
      timeout 1500 python3 -m harness submit --recipe llama8b-shape-bf16-h200x2-nixl-1p1d --launcher local \
        --results-dir "$root/$step" --no-predict --set topology.aggregated=null \
        --set benchmark.prompts_multiplier=4 --set benchmark.min_prompts=16 \
        --set 'benchmark.shapes=[{isl: 1024, osl: 128}, {isl: 4096, osl: 128}, {isl: 2048, osl: 128}]' \
        --set 'benchmark.concurrency=[1, 2, 4, 8, 16, 32]' ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    dsr1-shape-pdbench | dsr1-shape-nixl)
      timeout 2700 python3 -m harness submit --recipe "dsr1-shape-fp8-h200x1-${step#dsr1-shape-}-1p1d" --launcher local \
        --results-dir "$root" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    dsr1-shape-agg)
      timeout 2700 python3 -m harness submit --recipe dsr1-shape-fp8-h200x1-none-agg --launcher local \
        --results-dir "$root" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    dsr1-shape-weights)
      python3 scripts/device/make_model.py --shape dsr1-shape --weights random-init .cache/models/dsr1-shape-weights ;;
    dsr1-shape-known)
      python3 scripts/device/make_model.py --shape dsr1-shape --weights known-answer .cache/models/dsr1-shape-known ;;
    known-pdbench | known-nixl)
      timeout 2700 python3 -m harness submit --recipe "dsr1-shape-fp8-h200x1-${step#known-}-1p1d" --launcher local \
        --results-dir "$root" --set model=dsr1-shape-known ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    known-agg)
      timeout 2700 python3 -m harness submit --recipe dsr1-shape-fp8-h200x1-none-agg --launcher local \
        --results-dir "$root" --set model=dsr1-shape-known ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    known-nixl-8k)
      # Issue 47's one failed point again (its prefill died of a CUDA launch failure once in two
      # runs): NIXL 1P1D with both servers on the one GPU, ISL 8k (0.8-1.0 of it), OSL 256, c 16, 32.
      timeout 1500 python3 -m harness submit --recipe dsr1-shape-fp8-h200x1-nixl-1p1d --launcher local \
        --results-dir "$root" --set model=dsr1-shape-known --set 'benchmark.shapes=[{isl: 8192, osl: 256, range_ratio: 0.8}]' \
        --set 'benchmark.concurrency=[16, 32]' --set benchmark.prompts_multiplier=4 --set benchmark.min_prompts=16 \
        --set benchmark.sentinels.match_tokens=64 ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    known-x2 | known-x2-nixl)
      connector=pdbench; [[ $step == known-x2-nixl ]] && connector=nixl
      timeout 2700 python3 -m harness submit --recipe dsr1-shape-fp8-h200x2-pdbench-1p1d --launcher local \
        --results-dir "$root" --set model=dsr1-shape-known --set "connector.name=$connector" \
        ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    known-x4-*)
      timeout 6300 python3 -m harness submit --recipe "dsr1-shape-fp8-h200x4-${step#known-x4-}" --launcher local \
        --results-dir "$root" --set model=dsr1-shape-known ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    dsr1-shape-x2 | dsr1-shape-weights-x2)
      timeout 2700 python3 -m harness submit --recipe "${step%-x2}-fp8-h200x2-pdbench-1p1d" --launcher local \
        --results-dir "$root" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    dsr1-shape-x4-*)
      timeout 6300 python3 -m harness submit --recipe "dsr1-shape-fp8-h200x4-${step#dsr1-shape-x4-}" --launcher local \
        --results-dir "$root" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    *) echo "run_all: unknown step $step" >&2; false ;;
  esac
  echo "run_all: $step exited $? at $(date -u +%T)"
done
