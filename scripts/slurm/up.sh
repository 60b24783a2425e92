#!/usr/bin/env bash
# scripts/slurm/up.sh - stand up a real multi-node Slurm cluster on this one machine,
# for pdbench's tests and CI. Safe to run again: a healthy cluster with the same settings
# is left alone (well under a second); anything else is torn down and rebuilt.
#
# netns mode (default): each node is its own network + UTS namespace (slurm-nodeI) on the
#   bridge slurmbr0 (10.77.0.1): hostname nodeI, IP 10.77.0.(10+I), own loopback and port
#   space. munged and slurmctld run on the host; node names resolve through /etc/hosts.
# local mode (PDBENCH_SLURM_MODE=local): fallback where namespaces/bridges are not allowed:
#   N slurmd on the host (ports 17001..), every node shares hostname, IP and ports.
#
# Settings (environment):
#   PDBENCH_SLURM_NODES   number of nodes              (3)
#   PDBENCH_SLURM_CPUS    CPUs advertised per node     ($(nproc); may exceed the real count)
#   PDBENCH_SLURM_MEM     RealMemory per node, MB      (20000; not enforced, lets --mem work)
#   PDBENCH_SLURM_MODE    netns | local                (netns)
#   PDBENCH_SLURM_DIR     state, logs, spool           (/tmp/pdbench-slurm)
#   PDBENCH_SLURM_SMOKE   1 = finish with srun -N$N hostname   (1)
#   PDBENCH_SLURM_WAIT    seconds to wait for nodes to be idle (90)
# Needs root (re-execs itself through passwordless sudo if that exists). Debian/Ubuntu.
set -euo pipefail

die() { echo "[slurm-up] ERROR: $*" >&2; exit 1; }
log() { echo "[slurm-up $(date +%T)] $*"; }

if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then exec sudo -n -E bash "$0" "$@"; fi
  die "must run as root (no passwordless sudo either)"
fi

NNODES=${PDBENCH_SLURM_NODES:-3}
CPUS=${PDBENCH_SLURM_CPUS:-$(nproc)}
MEM=${PDBENCH_SLURM_MEM:-20000}
MODE=${PDBENCH_SLURM_MODE:-netns}
BASE=${PDBENCH_SLURM_DIR:-/tmp/pdbench-slurm}
SMOKE=${PDBENCH_SLURM_SMOKE:-1}
WAIT_S=${PDBENCH_SLURM_WAIT:-90}
SUBNET=10.77.0
BR=slurmbr0
CONF=/etc/slurm/slurm.conf
TAG="# managed by pdbench scripts/slurm/up.sh"
HOSTS_TAG="# pdbench-slurm"
LOCK=/tmp/pdbench-slurm.lock
HERE=$(cd "$(dirname "$0")" && pwd)

posint() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
{ posint "$NNODES" && [ "$NNODES" -le 200 ]; } || die "PDBENCH_SLURM_NODES must be 1..200, got '$NNODES'"
posint "$CPUS" || die "PDBENCH_SLURM_CPUS must be a positive integer, got '$CPUS'"
posint "$MEM" || die "PDBENCH_SLURM_MEM must be a positive integer (MB), got '$MEM'"
posint "$WAIT_S" || die "PDBENCH_SLURM_WAIT must be a positive number of seconds, got '$WAIT_S'"
case $MODE in netns|local) ;; *) die "PDBENCH_SLURM_MODE must be netns or local, got '$MODE'";; esac
NODES=(); for i in $(seq 1 "$NNODES"); do NODES+=("node$i"); done

# One up/down at a time (two pytest sessions may call ensure_cluster together). fd 9 must
# not leak into the daemons: a daemon holding it would keep the lock forever (see 9>&- below).
if [ -z "${PDBENCH_SLURM_LOCKED:-}" ]; then
  exec 9>"$LOCK"
  flock -w 300 9 || die "another up.sh/down.sh has held $LOCK for 300 s"
  export PDBENCH_SLURM_LOCKED=1
fi

# ---------------------------------------------------------------- the wanted config
if [ "$MODE" = netns ]; then
  CTL_ADDR=$SUBNET.1
  NODELINE="NodeName=node[1-$NNODES] NodeHostname=node[1-$NNODES] NodeAddr=$SUBNET.[11-$((10 + NNODES))] Port=6818"
else
  CTL_ADDR=127.0.0.1
  NODELINE="NodeName=node[1-$NNODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=17001-$((17000 + NNODES))"
fi
[ "$NNODES" = 1 ] && NODELINE=${NODELINE//\[1-1\]/1} && NODELINE=${NODELINE//\[11-11\]/11} && NODELINE=${NODELINE//17001-17001/17001}

want_conf() {
cat <<EOF
$TAG ($MODE mode, $NNODES nodes); scripts/slurm/down.sh removes it
ClusterName=pdbench
# "localhost" is accepted as the controller name whatever hostname(1) says.
SlurmctldHost=localhost($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# No cgroups: processes are tracked by parent pid; nothing is confined or enforced.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# No accounting (no slurmdbd): wait on jobs with 'scontrol show job', not sacct.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Trust the CPUs/RealMemory below even where they exceed the real machine.
SlurmdParameters=config_overrides
DependencyParameters=kill_invalid_depend
ReturnToService=2
# A job that lost a node fails; it is not silently requeued.
JobRequeue=0
MailProg=/bin/true
SlurmctldPort=6817
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmdSpoolDir=$BASE/spool/%n
StateSaveLocation=$BASE/state
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
InactiveLimit=0
# Points each task at its own node's dockerd, where containers-up.sh started one.
TaskProlog=$BASE/task-prolog.sh
KillWait=5
MinJobAge=300
# Generous: the machine is small and often busy with vLLM servers.
MessageTimeout=30
SlurmctldTimeout=60
SlurmdTimeout=120
Waittime=0
$NODELINE CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}
WANT=$(want_conf)

# ---------------------------------------------------------------- healthy already?
node_states() { timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null || true; }
count_ok() { node_states | grep -cE ' (idle|mix|mixed|alloc|allocated|comp|completing)$' || true; }
running() {  # running PIDFILE COMM: the pid file names a live process of that program
  local p st; p=$(tr -dc 0-9 2>/dev/null <"$1") || return 1
  [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] || return 1
  # a daemon killed a moment ago is a zombie until PID 1 reaps it: dead, though /proc still names it
  st=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
healthy() {
  [ -f "$BASE/up.ok" ] && [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$WANT" ] || return 1
  running "$BASE/run/slurmctld.pid" slurmctld || return 1
  # a dead slurmd shows as idle in sinfo until SlurmdTimeout; look at the daemons themselves
  local d; for d in "${NODES[@]}"; do running "$BASE/run/slurmd-$d.pid" slurmd || return 1; done
  if [ "$MODE" = netns ]; then
    for d in "${NODES[@]}"; do [ -e "/run/netns/slurm-$d" ] || return 1; done
  fi
  [ "$(count_ok)" = "$NNODES" ]
}
if healthy; then log "cluster already up: $NNODES nodes ($MODE), nothing to do"; exit 0; fi
# Same settings but some node drained/down (e.g. after an unkillable step): try RESUME first,
# so a healthy slurmctld and jobs on the other nodes survive.
if [ -f "$BASE/up.ok" ] && [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$WANT" ] && timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; then
  bad=$(node_states | awk '$2 ~ /^(drain|drng|drained|draining|down|fail)/ {print $1}' | paste -sd, -)
  if [ -n "$bad" ]; then
    log "resuming nodes $bad"
    timeout 10 scontrol update NodeName="$bad" State=RESUME 2>/dev/null || true
    for _ in $(seq 20); do healthy && { log "cluster up again after resume"; exit 0; }; sleep 0.5; done
  fi
fi

# ---------------------------------------------------------------- 1. packages
need=()
for c in slurmctld slurmd sbatch munged ip nsenter unshare flock; do command -v "$c" >/dev/null || need+=("$c"); done
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them"
  log "installing packages (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  APT=(-o DPkg::Lock::Timeout=120 -q)
  timeout 300 apt-get "${APT[@]}" update >"/tmp/pdbench-slurm-apt.log" 2>&1 \
    || { tail -5 /tmp/pdbench-slurm-apt.log >&2; die "apt-get update failed (log: /tmp/pdbench-slurm-apt.log)"; }
  timeout 600 apt-get "${APT[@]}" install -y --no-install-recommends \
      slurmctld slurmd slurm-client munge iproute2 util-linux >>"/tmp/pdbench-slurm-apt.log" 2>&1 \
    || { tail -5 /tmp/pdbench-slurm-apt.log >&2; die "apt-get install failed (log: /tmp/pdbench-slurm-apt.log)"; }
  for c in slurmctld slurmd sbatch munged ip nsenter; do command -v "$c" >/dev/null || die "$c still missing after install"; done
fi
# On a systemd host the packages start their own daemons; we run ours instead.
if [ -d /run/systemd/system ]; then systemctl stop slurmctld slurmd 2>/dev/null || true; fi

# ---------------------------------------------------------------- 2. clean leftovers
if [ -f "$BASE/up.ok" ] || [ -d "$BASE/run" ] || ip link show "$BR" >/dev/null 2>&1 || ip netns list 2>/dev/null | grep -q '^slurm-node'; then
  log "tearing down the previous cluster (settings changed or unhealthy)"
  PDBENCH_SLURM_KEEP_MUNGE=1 timeout 120 "$HERE/down.sh" >"/tmp/pdbench-slurm-down.log" 2>&1 \
    || { tail -5 /tmp/pdbench-slurm-down.log >&2; die "down.sh failed (log: /tmp/pdbench-slurm-down.log)"; }
fi
mkdir -p "$BASE"/{state,log,run,spool}

# ---------------------------------------------------------------- 3. munge
munge_ok() { timeout 5 munge -n 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }
if ! munge_ok; then
  [ -s /etc/munge/munge.key ] || { log "creating /etc/munge/munge.key"; mungekey --create --keyfile=/etc/munge/munge.key; }
  chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  log "starting munged"
  # --force: get past a stale socket left by a munged that died.
  timeout 20 runuser -u munge -- /usr/sbin/munged --force 9>&- || die "munged failed to start"
  for _ in $(seq 50); do munge_ok && break; sleep 0.2; done
  munge_ok || die "munged started but munge -n | unmunge fails"
  cp /run/munge/munged.pid "$BASE/run/munged.ours"   # down.sh stops only a munged we started
fi

# ---------------------------------------------------------------- 4. network, names
rewrite_hosts() {  # drop our lines, then append "$@"; rewrite in place (keeps the inode / bind mounts)
  local tmp; tmp=$(mktemp)
  grep -v "$HOSTS_TAG\$" /etc/hosts >"$tmp" || true
  for l in "$@"; do echo "$l $HOSTS_TAG" >>"$tmp"; done
  cat "$tmp" >/etc/hosts; rm -f "$tmp"
}
if [ "$MODE" = netns ]; then
  conflict=$(ip -o -4 addr show | awk -v s="$SUBNET." '$4 ~ "^"s {print $2}' | grep -vx "$BR" || true)
  [ -z "$conflict" ] || die "$SUBNET.0/24 is already used by interface(s) $conflict"
  log "creating bridge $BR and $NNODES node namespaces"
  ip link add "$BR" type bridge
  ip addr add "$CTL_ADDR/24" dev "$BR"
  ip link set "$BR" up
  lines=()
  for i in $(seq 1 "$NNODES"); do
    ns=slurm-node$i
    ip netns add "$ns"
    ip link add "slurmv$i" type veth peer name eth0 netns "$ns"
    ip link set "slurmv$i" master "$BR" up
    ip -n "$ns" link set lo up                       # jobs use 127.0.0.1 inside the node
    ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "$CTL_ADDR"
    lines+=("$SUBNET.$((10 + i)) node$i")
  done
  rewrite_hosts "${lines[@]}"
else
  rewrite_hosts "127.0.0.1 ${NODES[*]}"
fi

# ---------------------------------------------------------------- 5. slurm.conf
mkdir -p /etc/slurm
if [ -f "$CONF" ] && ! head -1 "$CONF" | grep -qF "$TAG"; then
  log "backing up the existing $CONF to $CONF.pdbench-backup"
  cp -p "$CONF" "$CONF.pdbench-backup"
fi
printf '%s\n' "$WANT" >"$CONF"
# Lines "export NAME=value" on a TaskProlog's stdout set the task's environment.
cat >"$BASE/task-prolog.sh" <<'PROLOG'
#!/bin/sh
sock=/run/pdbench-docker/$SLURMD_NODENAME.sock
[ -S "$sock" ] && echo "export DOCKER_HOST=unix://$sock"
exit 0
PROLOG
chmod 755 "$BASE/task-prolog.sh"

# ---------------------------------------------------------------- 6. daemons
log "starting slurmctld"
timeout 30 slurmctld -c 9>&- || { tail -20 "$BASE/log/slurmctld.log" >&2 || true; die "slurmctld failed to start"; }
for _ in $(seq 150); do timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.2; done
timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' || { tail -20 "$BASE/log/slurmctld.log" >&2 || true; die "slurmctld is not answering"; }

log "starting $NNODES slurmd ($MODE)"
for n in "${NODES[@]}"; do
  mkdir -p "$BASE/spool/$n"
  if [ "$MODE" = netns ]; then
    # nsenter, not 'ip netns exec': the latter remounts /sys in a private mount namespace, which
    # hides /sys/fs/cgroup, and slurmd 22.05 then dies with "Unable to initialize cgroup plugin".
    # unshare --uts gives the node (and every job step it forks) its own hostname.
    timeout 30 nsenter --net="/run/netns/slurm-$n" unshare --uts \
      sh -c "hostname $n && exec slurmd -N $n" 9>&- \
      || { tail -20 "$BASE/log/slurmd-$n.log" >&2 || true; die "slurmd $n failed to start"; }
  else
    timeout 30 slurmd -N "$n" 9>&- || { tail -20 "$BASE/log/slurmd-$n.log" >&2 || true; die "slurmd $n failed to start"; }
  fi
done

log "waiting (up to ${WAIT_S}s) for $NNODES nodes to be idle"
deadline=$((SECONDS + WAIT_S))
until [ "$(node_states | grep -c ' idle$' || true)" = "$NNODES" ]; do
  if [ $SECONDS -ge $deadline ]; then
    node_states >&2; tail -n 5 "$BASE"/log/*.log >&2 || true
    die "not all $NNODES nodes idle after ${WAIT_S}s"
  fi
  sleep 0.3
done

# ---------------------------------------------------------------- 7. checks
if [ "$MODE" = netns ]; then
  # Each node reaches its own loopback and every other node over the bridge (slurmd's port
  # stands in for any port a job binds on 0.0.0.0).
  for i in $(seq 1 "$NNODES"); do
    for dst in 127.0.0.1 "$SUBNET.$((10 + i % NNODES + 1))" "$CTL_ADDR:6817"; do
      case $dst in *:*) host=${dst%:*} port=${dst#*:} ;; *) host=$dst port=6818 ;; esac
      timeout 5 nsenter --net="/run/netns/slurm-node$i" bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null \
        || die "node$i cannot connect to $host:$port (is bridge traffic filtered? bridge-nf-call-iptables=$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo n/a))"
    done
  done
fi
if [ "$SMOKE" = 1 ]; then
  out=$(cd "$BASE" && timeout 60 srun -N"$NNODES" -n"$NNODES" hostname 2>&1 | sort) || { echo "$out" >&2; die "smoke srun -N$NNODES hostname failed"; }
  if [ "$MODE" = netns ]; then
    [ "$(printf '%s\n' "$out" | sort -u)" = "$(printf '%s\n' "${NODES[@]}" | sort)" ] || { echo "$out" >&2; die "smoke srun printed unexpected hostnames"; }
  fi
  log "smoke srun -N$NNODES hostname: $(printf '%s\n' "$out" | paste -sd' ' -)"
fi
echo "$MODE $NNODES" >"$BASE/up.ok"
log "cluster up: $NNODES nodes ($MODE), conf $CONF, logs $BASE/log"
