#!/usr/bin/env bash
# The main job on the embedded default: install, build the tiny model, run tiny-fp32-cpu-nixl-1p1d
# (real vLLM prefill + decode with NIXL KV transfer, the pdbench proxy and client) on this
# machine, and print where the results are.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/pdbench tiny-model
exec .venv/bin/pdbench submit --recipe tiny-fp32-cpu-nixl-1p1d --launcher local "$@"
