#!/usr/bin/env bash
# pdbench container wrapper · recipe dsr1-fp8-h200-nixl-1p2d · fingerprint c337bbf56ba32204
# Runs on the host of every node (one Slurm task per node, started by job.slurm): checks
# this node's docker and image, removes stale pdbench containers, and runs server.sh
# in one container with the node's network, IPC and devices, the run directory and the
# pdbench tree (read-only). While the container runs, this wrapper touches a heartbeat file;
# `pdbench node` inside tears down once it stops (Slurm killed this task, the node was
# lost), so no container outlives its job although it runs outside Slurm's tracking.
# A failure here is recorded as the node's root cause, as `pdbench node` records its own.
# Slurm's signals can come before the handlers below exist (its time-limit warning up to a
# minute early, so at the job's first second): until then a signal is only remembered.
caught=""
trap 'caught=${caught:-TERM}' TERM
trap 'caught=${caught:-INT}' INT
trap 'caught=${caught:-HUP}' HUP
trap 'caught=${caught:-USR2}' USR2
set -euo pipefail
RUNTIME=docker
IMAGE=registry.example.internal/vllm/vllm-openai:v0.32.0
GPUS=nvidia
: "${RUN_DIR:?}" "${PDBENCH_ROOT:?}" "${SLURM_JOB_ID:?}" "${SLURM_NODEID:?}"
NODE=$SLURM_NODEID
NAME="pdbench_${SLURM_JOB_ID}_${NODE}"
STATE="$RUN_DIR/state"
LOG="logs/container-node$NODE.log"
HEARTBEAT="$STATE/heartbeat-node$NODE"
JOB_RECORD="$STATE/slurm-job-node$NODE"
err=""

json_str() {
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/\\t}; s=${s//$'\r'/}; s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}
# fail CAUSE [LOG]: state/root_cause and state/abort, each written once (ln does not
# replace), so the first cause of the job wins; then exit.
fail() {
  local cause=$1 log=${2:-} tail="" reason tmp
  reason="node $NODE: $cause"
  if [ -n "$log" ]; then
    tail=$(tail -n 15 "$RUN_DIR/$log" 2>/dev/null | cut -c1-400 || true)
    reason="$reason; last lines of $log:"$'\n'"${tail:-  (empty)}"
  fi
  echo "pdbench: $reason" >&2
  mkdir -p "$STATE" 2>/dev/null || true  # a failure before the run's state/ was made
  tmp=$(mktemp "$STATE/.failure-node$NODE.XXXXXX")
  printf '{"node": %s, "cause": %s, "process": null, "role": null, "log": %s, "log_tail": %s, "primary": true, "time": %s, "reason": %s}\n' \
    "$NODE" "$(json_str "$cause")" "$( [ -n "$log" ] && json_str "$log" || echo null)" \
    "$( [ -n "$log" ] && json_str "$tail" || echo null)" "$(date +%s.%N)" "$(json_str "$reason")" >"$tmp"
  ln "$tmp" "$STATE/root_cause" 2>/dev/null || true
  ln "$tmp" "$STATE/abort" 2>/dev/null || true
  rm -f "$tmp"
  exit 1
}
# last_line FILE: the last non-empty line of FILE, cut for a one-line cause.
last_line() { grep -v '^\s*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-300; }
# write_record FILE JSON: FILE appears whole or not at all.
write_record() {
  local tmp
  tmp=$(mktemp "$1.XXXXXX") && printf '%s\n' "$2" >"$tmp" && mv -f "$tmp" "$1"
}
# image_id RUNTIME IMAGE: the image's id as sha256:<hex> (podman prints it without the
# algorithm); fails, printing what the runtime said, when there is none.
image_id() {
  local out
  out=$(timeout 60 "$1" image inspect --format '{{.Id}}' "$2" 2>&1) || { printf '%s' "$out" | last_line /dev/stdin; return 1; }
  case $out in sha256:*) ;; *) out="sha256:$out" ;; esac
  if [[ $out =~ ^sha256:[0-9a-f]{64}$ ]]; then printf '%s' "$out"; else printf 'no image id in %s' "${out:0:200}"; return 1; fi
}
# image_id_record FILE NODE RUNTIME IMAGE RAN: the id of RAN, the image the servers run (the
# set-up steps' image when there are any; then IMAGE's id too, as base_digest), and the
# registry digests the runtime knows for it (none for an image loaded from a file).
image_id_record() {
  local file=$1 node=$2 runtime=$3 image=$4 ran=$5 out digest=null reason=null digests base=null
  if out=$(image_id "$runtime" "$ran"); then digest=$(json_str "$out")
  else reason=$(json_str "$runtime image inspect $ran: $out"); fi
  digests=$(timeout 60 "$runtime" image inspect --format '{{json .RepoDigests}}' "$ran" 2>/dev/null) || digests=null
  [[ $digests =~ ^\[.*\]$ ]] || digests=null
  if [ "$ran" != "$image" ] && out=$(image_id "$runtime" "$image"); then base=$(json_str "$out"); fi
  write_record "$file" "$(printf '{"node": %s, "runtime": %s, "image": %s, "ran": %s, "kind": "image id", "digest": %s, "repo_digests": %s, "base_digest": %s, "reason": %s}' \
    "$node" "$(json_str "$runtime")" "$(json_str "$image")" "$(json_str "$ran")" "$digest" "$digests" "$base" "$reason")"
}
# A signal before the container runs (Slurm's time-limit warning can come this early, up to a
# minute before its time): record Slurm's view of the job as on_signal does below, then stop
# as this node's failure; the warning's cause is the one `pdbench node` records for it.
# shellcheck disable=SC2317  # called from the traps below
setup_signal() {
  caught=${caught:-$1}
  timeout 3 scontrol -o show job "$SLURM_JOB_ID" >"$JOB_RECORD.tmp" 2>/dev/null && mv "$JOB_RECORD.tmp" "$JOB_RECORD"
  if [ "$caught" = USR2 ]; then fail 'Slurm warned that the job'"'"'s time limit is near (sbatch --signal=USR2): the sweep was stopped before it; the points finished so far are kept'; fi
  fail "received SIG$caught while setting up the container, before pdbench's node runtime ran"
}
# setup_exit RC: the set-up may also end before a trap ran: set -e on a command Slurm's
# signal killed (status 128+N), or bash failing a trap inside a command substitution's
# child. Nothing recorded yet: record the signal it died of, else its exit code.
# shellcheck disable=SC2317  # called from the EXIT trap
setup_exit() {
  if [ -n "$err" ]; then rm -f "$err"; fi
  if [ "$1" = 0 ] || [ -e "$STATE/abort" ]; then return 0; fi
  if [ -z "$caught" ] && [ "$1" -gt 128 ]; then caught=$(kill -l "$(($1 - 128))" 2>/dev/null || true); fi
  case $caught in
    "") fail "setting up the container stopped with exit code $1, before pdbench's node runtime ran" ;;
    *) setup_signal "$caught" ;;
  esac
}
trap 'setup_exit $?' EXIT
trap 'setup_signal TERM' TERM
trap 'setup_signal INT' INT
trap 'setup_signal HUP' HUP
trap 'setup_signal USR2' USR2
if [ -n "$caught" ]; then setup_signal "$caught"; fi
# Commands only from here, each under the handlers above.
mkdir -p "$STATE" "$RUN_DIR/logs"
err=$(mktemp)

# ----------------------------------------------------------- the node's runtime and image
command -v "$RUNTIME" >/dev/null || fail "$RUNTIME is not installed on $(hostname)"
timeout 60 "$RUNTIME" version >/dev/null 2>"$err" \
  || fail "$RUNTIME on $(hostname) does not answer (daemon down or socket not permitted): $(last_line "$err")"
if ! timeout 60 "$RUNTIME" image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "pdbench: node $NODE: pulling $IMAGE" >&2
  timeout 1800 "$RUNTIME" pull "$IMAGE" >/dev/null 2>"$err" \
    || fail "image $IMAGE is not on $(hostname) and could not be pulled: $(last_line "$err")"
fi

# ----------------------------------------------------------- what runs: the image's id, for the results
image_id_record "$STATE/image-node$NODE.json" "$NODE" "$RUNTIME" registry.example.internal/vllm/vllm-openai:v0.32.0 "$IMAGE" \
  || echo "pdbench: node $NODE: could not record the id of image $IMAGE" >&2

# pdbench runs inside the image from the shared tree: its dependencies, and the KV
# connector's package, must import there (a stock vLLM image may lack them; set-up steps
# install them). Seconds here instead of a failure after the queue.
probe=(timeout 120 "$RUNTIME" run --rm --entrypoint "" --network none -e "PYTHONPATH=$PDBENCH_ROOT"
  -e PYTHONDONTWRITEBYTECODE=1 -v "$PDBENCH_ROOT:$PDBENCH_ROOT:ro" "$IMAGE")
"${probe[@]}" python3 -c 'import harness.node.runtime, harness.proxy.server, harness.bench.client, nixl' >/dev/null 2>"$err" \
  || fail "pdbench or the KV connector's package cannot be imported in image $IMAGE on $(hostname): $(last_line "$err")"

# ----------------------------------------------------------- stale containers
# This job's name from an earlier attempt, and any pdbench container whose job has ended
# (one that outlived a crash must not hold this node's GPUs).
timeout 60 "$RUNTIME" rm -f "$NAME" >/dev/null 2>&1 || true
for c in $(timeout 60 "$RUNTIME" ps -a -q --filter label=pdbench.job 2>/dev/null); do
  job=$(timeout 60 "$RUNTIME" inspect --format '{{ index .Config.Labels "pdbench.job" }}' "$c" 2>/dev/null || true)
  if [ -z "$job" ] || [ "$job" = "$SLURM_JOB_ID" ]; then continue; fi
  # Only a job Slurm no longer knows (not one Slurm could not be asked about).
  if state=$(timeout 10 squeue -h -j "$job" -o %T 2>"$err") || grep -q 'Invalid job id' "$err"; then
    if [ -z "$state" ]; then
      echo "pdbench: node $NODE: removing container $c of ended job $job" >&2
      timeout 60 "$RUNTIME" rm -f "$c" >/dev/null 2>&1 || true
    fi
  fi
done

# ----------------------------------------------------------- the container
# As root, as the vendors' own jobs run (device groups, memlock for RDMA registration).
# The stock vLLM images' entrypoint is `vllm`: override it.
ARGS=(--rm --init --name "$NAME" --label "pdbench.job=$SLURM_JOB_ID" --entrypoint ""
  --network host --ipc host --privileged)
if [ "$GPUS" = auto ]; then
  if [ -e /dev/kfd ]; then GPUS=amd
  elif [ -e /dev/nvidiactl ]; then GPUS=nvidia
  else GPUS=none
  fi
fi
case $GPUS in
  amd) ARGS+=(--device /dev/kfd --device /dev/dri) ;;
  nvidia) if [ "$RUNTIME" = docker ]; then ARGS+=(--gpus all); else ARGS+=(--device nvidia.com/gpu=all); fi ;;
esac
if [ -d /dev/infiniband ]; then ARGS+=(--device /dev/infiniband --ulimit memlock=-1:-1); fi
# `pdbench nic` reads the RDMA QoS (traffic class, service level) from AMD Pensando's
# nicctl: the host's, read-only, where it has one.
if NICCTL=$(command -v nicctl); then ARGS+=(-v "$NICCTL:/usr/sbin/nicctl:ro"); fi
for v in SLURM_JOB_ID SLURM_JOB_NAME SLURM_NODEID SLURM_PROCID SLURM_LOCALID SLURM_NNODES SLURM_JOB_NUM_NODES \
         SLURM_NTASKS SLURM_JOB_NODELIST SLURMD_NODENAME RUN_DIR PDBENCH_ROOT; do
  if [ -n "${!v+x}" ]; then ARGS+=(-e "$v"); fi
done
# No bytecode written (the checkout is mounted read-only), and the bytecode that is there read: the
# image's, compiled at install, and the checkout's own. A PYTHONPYCACHEPREFIX (the seed's
# /tmp/pycache, empty in every new container) makes Python ignore both and compile everything each
# process imports from source: vLLM's API server imported in 50 s instead of 24 on 2 cores.
ARGS+=(-e "PYTHONPATH=$PDBENCH_ROOT" -e PYTHONDONTWRITEBYTECODE=1 -e "PDBENCH_CONTAINER=$RUNTIME"
  -e "PDBENCH_HEARTBEAT=$HEARTBEAT" -e "PDBENCH_SLURM_JOB_RECORD=$JOB_RECORD"
  -v "$RUN_DIR:$RUN_DIR" -v "$PDBENCH_ROOT:$PDBENCH_ROOT:ro")
ARGS+=(-v /lustre/shared/hf-cache:/lustre/shared/hf-cache:ro)

# The set-up is over: from here the container's own end is recorded below.
trap 'rm -f "$err"' EXIT
touch "$HEARTBEAT"
"$RUNTIME" run "${ARGS[@]}" "$IMAGE" bash "$RUN_DIR/server.sh" >>"$RUN_DIR/$LOG" 2>&1 &
cpid=$!
# Slurm signals every process of the task; docker run passes it to the container too.
# Here: record why (the container has no scontrol), then make sure the container has it.
# The signal is remembered: one that comes before `pdbench node` has its handlers kills the
# container, and is then this node's cause (the warning's as `pdbench node` records it).
relayed=""
# shellcheck disable=SC2317  # called from the traps below
on_signal() {
  relayed=$1
  timeout 3 scontrol -o show job "$SLURM_JOB_ID" >"$JOB_RECORD.tmp" 2>/dev/null && mv "$JOB_RECORD.tmp" "$JOB_RECORD"
  timeout 10 "$RUNTIME" kill --signal "$1" "$NAME" >/dev/null 2>&1 || true
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP
trap 'on_signal USR2' USR2  # Slurm's warning before the time limit
while kill -0 "$cpid" 2>/dev/null; do
  # Slurm signals every process of the task, this touch too; under set -e its death would
  # end the script before its trap recorded the signal.
  touch "$HEARTBEAT" || true
  sleep 2 &
  wait $! || true
done
rc=0
wait "$cpid" || rc=$?
# bash's wait answers -1 when the container was reaped while a trap ran and its status is
# lost; that is a failure whose code is unknown, never a code to pass on.
code=$rc
if [ "$rc" -lt 0 ]; then code=unknown; rc=1; fi
timeout 60 "$RUNTIME" rm -f "$NAME" >/dev/null 2>&1 || true
if [ "$rc" != 0 ] && [ ! -e "$STATE/exit-node$NODE.json" ] && [ ! -e "$STATE/abort" ]; then
  case $relayed in
    "") fail "the container exited with code $code before pdbench's node runtime ran" "$LOG" ;;
    USR2) fail 'Slurm warned that the job'"'"'s time limit is near (sbatch --signal=USR2): the sweep was stopped before it; the points finished so far are kept' ;;
    *) fail "received SIG$relayed while the container started, before pdbench's node runtime ran (exit code $code)" "$LOG" ;;
  esac
fi
exit "$rc"
