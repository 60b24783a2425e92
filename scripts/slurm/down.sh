#!/usr/bin/env bash
# scripts/slurm/down.sh - tear down the cluster made by scripts/slurm/up.sh. Safe to run
# any number of times. Cancels jobs, stops slurmd/slurmctld (SIGTERM, then SIGKILL), kills
# the nodes' dockerd (scripts/slurm/containers-up.sh), whatever is left in the node namespaces, deletes the namespaces and the bridge, stops
# munged only if up.sh started it, and removes the managed slurm.conf, the /etc/hosts lines
# and the state directory. Packages stay installed.
#   PDBENCH_SLURM_DIR        state directory (/tmp/pdbench-slurm)
#   PDBENCH_SLURM_KEEP_MUNGE 1 = leave munged running (up.sh uses this when rebuilding)
set -uo pipefail

die() { echo "[slurm-down] ERROR: $*" >&2; exit 1; }
log() { echo "[slurm-down $(date +%T)] $*"; }

if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then exec sudo -n -E bash "$0" "$@"; fi
  die "must run as root (no passwordless sudo either)"
fi

BASE=${PDBENCH_SLURM_DIR:-/tmp/pdbench-slurm}
KEEP_MUNGE=${PDBENCH_SLURM_KEEP_MUNGE:-0}
BR=slurmbr0
CONF=/etc/slurm/slurm.conf
TAG="# managed by pdbench scripts/slurm/up.sh"
HOSTS_TAG="# pdbench-slurm"
LOCK=/tmp/pdbench-slurm.lock

if [ -z "${PDBENCH_SLURM_LOCKED:-}" ]; then
  exec 9>"$LOCK"
  flock -w 300 9 || die "another up.sh/down.sh has held $LOCK for 300 s"
  export PDBENCH_SLURM_LOCKED=1
fi

# Live pid from a pid file, only if that process is still the named program (no pid reuse).
pid_of() {  # pid_of FILE COMM
  local p; p=$(tr -dc 0-9 2>/dev/null <"$1") || true
  [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] && echo "$p"
  return 0
}
# Running (not a zombie: on this VM, PID 1 reaps orphans only every second or two).
alive() {
  local p st out=()
  for p in "$@"; do
    st=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1) || true
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ] && out+=("$p")
  done
  echo "${out[*]}"
}
stop_pids() {  # stop_pids SECONDS PID...: SIGTERM, wait, then SIGKILL
  local t=$1; shift
  local -a pids; read -ra pids <<<"$(alive "$@")"
  [ ${#pids[@]} -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null
  for _ in $(seq $((t * 5))); do
    read -ra pids <<<"$(alive "${pids[@]}")"
    [ ${#pids[@]} -eq 0 ] && return 0
    sleep 0.2
  done
  log "SIGKILL to ${pids[*]}"; kill -KILL "${pids[@]}" 2>/dev/null
  sleep 0.2; return 0
}

# 1. cancel jobs, so slurmstepd ends the job processes in order (bounded wait)
if [ -n "$(pid_of "$BASE/run/slurmctld.pid" slurmctld)" ] && [ -f "$CONF" ] && head -1 "$CONF" | grep -qF "$TAG" \
   && timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; then
  mapfile -t jobs < <(timeout 10 squeue -h -o %i 2>/dev/null)
  if [ ${#jobs[@]} -gt 0 ]; then
    log "cancelling jobs: ${jobs[*]}"
    timeout 10 scancel "${jobs[@]}" 2>/dev/null
    for _ in $(seq 100); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.3; done
    left=$(timeout 5 squeue -h -o '%i %T' 2>/dev/null | paste -sd' ' -)
    [ -n "$left" ] && log "jobs still listed after 30 s (going on): $left"
  fi
fi

# 2. slurmd(s), then slurmctld, by pid file
pids=()
for f in "$BASE"/run/slurmd-*.pid; do p=$(pid_of "$f" slurmd); [ -n "$p" ] && pids+=("$p"); done
[ ${#pids[@]} -gt 0 ] && { log "stopping slurmd: ${pids[*]}"; stop_pids 10 "${pids[@]}"; }
p=$(pid_of "$BASE/run/slurmctld.pid" slurmctld)
[ -n "$p" ] && { log "stopping slurmctld: $p"; stop_pids 10 "$p"; }

# 3. the nodes' dockerd of containers-up.sh (images stay in /var/lib/pdbench-docker)
pids=()
for f in /run/pdbench-docker/node*.pid; do [ -f "$f" ] && p=$(pid_of "$f" dockerd) && [ -n "$p" ] && pids+=("$p"); done
[ ${#pids[@]} -gt 0 ] && { log "stopping the nodes' dockerd: ${pids[*]}"; stop_pids 20 "${pids[@]}"; }

# 4. anything left in the node namespaces (slurmstepd, job processes that escaped), then them
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^slurm-node'); do
  mapfile -t left < <(ip netns pids "$ns" 2>/dev/null)
  [ ${#left[@]} -gt 0 ] && { log "killing what is left in $ns: ${left[*]}"; stop_pids 5 "${left[@]}"; }
  ip netns del "$ns" 2>/dev/null || log "could not delete namespace $ns"
done
for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^slurmv[0-9]+$'); do
  ip link del "$l" 2>/dev/null || true
done
if ip link show "$BR" >/dev/null 2>&1; then log "deleting bridge $BR"; ip link del "$BR"; fi
# The stopped dockerd's pid files and sockets (a SIGKILLed one leaves them): the tests count
# each node's daemons by them (tests/helpers/node_daemons.py), so none may outlive its daemon.
rm -f /run/pdbench-docker/node*.pid /run/pdbench-docker/node*.sock /run/pdbench-docker/node*/containerd/containerd.pid

# 5. munged, only if up.sh started it
if [ "$KEEP_MUNGE" != 1 ] && [ -f "$BASE/run/munged.ours" ]; then
  p=$(pid_of "$BASE/run/munged.ours" munged)
  [ -n "$p" ] && { log "stopping munged: $p"; stop_pids 10 "$p"; }
  rm -f "$BASE/run/munged.ours"
fi

# 6. config, /etc/hosts lines, state
if [ -f "$CONF" ] && head -1 "$CONF" | grep -qF "$TAG"; then
  rm -f "$CONF"
  if [ -f "$CONF.pdbench-backup" ]; then log "restoring $CONF from its backup"; mv "$CONF.pdbench-backup" "$CONF"; fi
fi
if grep -q "$HOSTS_TAG\$" /etc/hosts 2>/dev/null; then
  tmp=$(mktemp); grep -v "$HOSTS_TAG\$" /etc/hosts >"$tmp"; cat "$tmp" >/etc/hosts; rm -f "$tmp"   # in place
fi
if [ -d "$BASE" ]; then
  # keep only the record that munged is ours, if munged stays up
  find "$BASE" -mindepth 1 -maxdepth 1 ! -name run -exec rm -rf {} +
  find "$BASE/run" -mindepth 1 ! -name munged.ours -exec rm -rf {} + 2>/dev/null
  [ -e "$BASE/run/munged.ours" ] || rm -rf "$BASE"
fi
log "down"
