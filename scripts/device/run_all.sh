#!/usr/bin/env bash
# On the GPU machine, after stage_device.py install: the measurements of docs/gpu.md, one after
# another on the one GPU: 1P1D with the bundled connector, 1P1D with NIXL, one instance alone.
#   bash scripts/device/run_all.sh RESULTS_ROOT [STEP...]    steps: pdbench nixl single (default: all)
# On two GPUs (nvidia-h200-x2): steps x2-pdbench x2-nixl, prefill on GPU 1 and decode on GPU 0;
# their reference is `single`, which then runs on GPU 0 alone.
# Each job's exit status is printed; a failed one does not stop the next.
set -uo pipefail
root=${1:?usage: run_all.sh RESULTS_ROOT [STEP...]}; shift
steps=${*:-pdbench nixl single}
export PYTHONPATH="/tmp/pdbench-site:$PWD" PATH="/tmp/pdbench-site/bin:$PATH" PYTHONUNBUFFERED=1
mkdir -p "$root"
for step in $steps; do
  echo "run_all: $step starts at $(date -u +%T)"
  case $step in
    pdbench | nixl)
      timeout 3300 python3 -m harness submit --recipe "gpu-h200-8b-1p1d-$step" --launcher local \
        --results-dir "$root" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    x2-pdbench | x2-nixl)
      timeout 3300 python3 -m harness submit --recipe "gpu-h200x2-8b-1p1d-${step#x2-}" --launcher local \
        --results-dir "$root" ${SUBMIT_SET:+--set "$SUBMIT_SET"} ;;
    single) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout 2400 bash scripts/device/run_single.sh "$root/single" ;;
    *) echo "run_all: unknown step $step" >&2; false ;;
  esac
  echo "run_all: $step exited $? at $(date -u +%T)"
done
