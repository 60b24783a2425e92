#!/usr/bin/env bash
# Mooncake's transfer engine in ./.venv, for the real Mooncake PD job on CPU
# (tests/e2e/test_mooncake_e2e.py); from PyPI and apt only; idempotent. scripts/setup.sh runs it.
# - mooncake-transfer-engine-non-cuda: the default mooncake-transfer-engine wheel links
#   libcudart.so.12 and libcuda.so.1, so it does not import on a machine without CUDA.
# - libibverbs1 (with libnl-3, libnl-route-3): engine.so links them even for TCP.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PDBENCH_VENV:-.venv}
MOONCAKE_VERSION=${MOONCAKE_VERSION:-0.3.13.post1}

if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 ' && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libibverbs1) \
    >/dev/null
fi
if ! "$VENV/bin/python" -c \
  "import importlib.metadata as m, sys; sys.exit(m.version('mooncake-transfer-engine-non-cuda') != '$MOONCAKE_VERSION')" \
  2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION"
fi
"$VENV/bin/python" -c 'import mooncake.engine' || {
  echo "setup_mooncake.sh: mooncake.engine does not import (is libibverbs.so.1 installed?)" >&2
  exit 1
}
