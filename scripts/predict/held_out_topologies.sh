#!/usr/bin/env bash
# docs/predict.md's held-out topologies on the local Slurm cluster (CPU, the tiny model): a 1P1D
# measured without a prediction, then 2P1D and 1P2D, each predicted by `pdbench submit
# --predict-from` that 1P1D before it runs (every result keeps its prediction and error), and the
# report of the three, predicted against measured point by point.
#   bash scripts/predict/held_out_topologies.sh RESULTS_DIR     (about 10 minutes on 2 cores)
# Keep the machine otherwise quiet: the figures are timings.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
results=${1:?usage: held_out_topologies.sh RESULTS_DIR}
recipe=tiny-fp32-cpu-nixl-1p2d
py=.venv/bin/python
unset PYTHONDONTWRITEBYTECODE
timeout 60 sinfo >/dev/null 2>&1 || scripts/slurm/up.sh || exit
sweep=(--set benchmark.min_prompts=16 --set benchmark.prompts_multiplier=2 --set benchmark.num_warmups=1
  --set benchmark.cooldown_s=0 --set 'benchmark.concurrency=[1, 2, 4, 8, 16, 32]')
log=$(mktemp) && trap 'rm -f "$log"' EXIT
runs=()
submit() {  # submit PREFILL DECODE [OPTION...]: one xP+yD of the recipe, one node per worker
  local p=$1 d=$2 rc; shift 2
  echo "== ${p}P${d}D $(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg)"
  timeout 900 "$py" -m harness submit --recipe "$recipe" --cluster local "${sweep[@]}" --skip-flag-check --wait \
    --set "topology.prefill.workers=$p" --set "topology.prefill.nodes=$p" \
    --set "topology.decode.workers=$d" --set "topology.decode.nodes=$d" --results-dir "$results" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  echo "== ${p}P${d}D exited $rc at $(date -u +%T)"
  run=$(sed -n 's/^run directory: //p' "$log" | head -1)
  # A job that failed keeps its partial results: still reported; one that made no run is not.
  if [[ -d $run ]]; then runs+=("$run"); else echo "held_out_topologies: ${p}P${d}D made no run directory" >&2; fi
  [[ $rc == 0 ]] || failed=1
}
failed=0
submit 1 1 --no-predict
[[ ${#runs[@]} == 1 ]] || exit 1
source_run=${runs[0]}
submit 2 1 --predict-from "$source_run"
submit 1 2 --predict-from "$source_run"
"$py" -m harness report "${runs[@]}" --format md || exit
exit "$failed"
