#!/usr/bin/env bash
# scripts/slurm/containers-up.sh - give each node of the cluster of up.sh its container
# runtimes, as a GPU cluster's nodes have them, and load an image into them:
#   - Docker: one dockerd per node, started inside that node's network namespace (own
#     data-root, exec-root, pidfile and socket /run/pdbench-docker/nodeI.sock). Slurm's
#     TaskProlog (written by up.sh) points each task's DOCKER_HOST at its node's daemon, so
#     `docker run --network host` in a job is that node's network.
#   - Podman: daemonless; /etc/containers/containers.conf (a managed block) selects runc and
#     rlimits this host allows (crun fails on its hybrid cgroups; root lacks CAP_SYS_RESOURCE).
#
#   scripts/slurm/containers-up.sh TAG TARBALL   (as printed by scripts/image/build.sh)
#
# Safe to run again: a daemon that answers is kept, an image already loaded is not loaded
# again. scripts/slurm/down.sh stops the daemons. Needs root and a cluster in netns mode.
set -euo pipefail
die() { echo "[containers-up] ERROR: $*" >&2; exit 1; }
log() { echo "[containers-up $(date +%T)] $*" >&2; }
[ "$(id -u)" = 0 ] || die "must run as root"
[ $# = 2 ] || die "usage: containers-up.sh TAG TARBALL"
TAG=$1 TARBALL=$2
[ -f "$TARBALL" ] || die "no image tarball at $TARBALL (run scripts/image/build.sh)"
RUN=/run/pdbench-docker
DATA=/var/lib/pdbench-docker
# The stock vLLM images' conventions: `vllm` is the entrypoint and the image's Python is
# first on PATH. A job that forgets to override the entrypoint fails here as it would there.
CHANGES=(--change 'ENTRYPOINT ["vllm"]' --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')

mapfile -t NODES < <(ip netns list | awk '$1 ~ /^slurm-node[0-9]+$/ {sub("slurm-", "", $1); print $1}' | sort -V)
[ ${#NODES[@]} -gt 0 ] || die "no slurm-node* namespaces: run scripts/slurm/up.sh (netns mode) first"
need=()
for c in dockerd podman runc nsenter; do command -v "$c" >/dev/null || need+=("$c"); done
# podman's --init needs catatonit
[ -x /usr/libexec/podman/catatonit ] || need+=(catatonit)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them"
  log "installing docker.io podman runc catatonit (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get -o DPkg::Lock::Timeout=120 -q install -y --no-install-recommends \
    docker.io podman runc catatonit >/tmp/pdbench-containers-apt.log 2>&1 \
    || { tail -5 /tmp/pdbench-containers-apt.log >&2; die "apt-get install failed (log: /tmp/pdbench-containers-apt.log)"; }
  # Debian's packages would start a host-wide dockerd where systemd runs; the nodes have their own.
  if [ -d /run/systemd/system ]; then systemctl stop docker.service docker.socket 2>/dev/null || true; fi
fi

# ------------------------------------------------------------------ podman
CONF=/etc/containers/containers.conf
MARK="# pdbench scripts/slurm/containers-up.sh"
if ! grep -qF "$MARK" "$CONF" 2>/dev/null; then
  mkdir -p /etc/containers
  [ -f "$CONF" ] && grep -q '^\[engine\]\|^\[containers\]' "$CONF" && die "$CONF has its own [engine]/[containers]; set runtime=\"runc\" and default_ulimits there"
  cat >>"$CONF" <<CONFEOF
$MARK
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
CONFEOF
fi
# Earlier builds of the CI image are superseded: removed before the new one comes in, so that
# the disk holds one build per store (a build is about 3.5 GB; a full disk fails the import).
# shellcheck disable=SC2016  # Go templates, not shell
fmt='{{.Repository}}:{{.Tag}}'
timeout 60 podman images --format "$fmt" | grep '^localhost/pdbench-ci:' | grep -vxF "$TAG" | xargs -r timeout 300 podman rmi -f >/dev/null 2>&1 || true
if ! timeout 60 podman image exists "$TAG"; then
  log "podman: importing $TAG"
  timeout 1800 podman import "${CHANGES[@]}" "$TARBALL" "$TAG" >/dev/null
fi

# ------------------------------------------------------------------ one dockerd per node
mkdir -p "$RUN" "$DATA"
answers() { timeout 10 docker -H "unix://$RUN/$1.sock" version >/dev/null 2>&1; }
for n in "${NODES[@]}"; do
  answers "$n" && continue
  log "starting dockerd of $n"
  rm -f "$RUN/$n.sock" "$RUN/$n.pid"
  # nsenter, not `ip netns exec` (which remounts /sys: "Devices cgroup isn't mounted").
  # Its own UTS namespace named like the node: a --network host container takes the
  # daemon's host name, as on a real node. --bridge none --iptables=false: containers use
  # the node's network (--network host).
  # shellcheck disable=SC2016  # "$1" is the inner shell's
  nsenter --net="/run/netns/slurm-$n" unshare --uts setsid sh -c 'hostname "$1"; shift; exec "$@"' sh "$n" dockerd \
    --data-root "$DATA/$n" --exec-root "$RUN/$n" --pidfile "$RUN/$n.pid" \
    -H "unix://$RUN/$n.sock" --bridge none --iptables=false --ip-masq=false \
    >"$RUN/$n.log" 2>&1 </dev/null &
done
for n in "${NODES[@]}"; do
  for _ in $(seq 120); do answers "$n" && break; sleep 0.5; done
  answers "$n" || { tail -20 "$RUN/$n.log" >&2; die "dockerd of $n does not answer on $RUN/$n.sock"; }
done
for n in "${NODES[@]}"; do
  timeout 60 docker -H "unix://$RUN/$n.sock" images --format "$fmt" | grep '^localhost/pdbench-ci:' | grep -vxF "$TAG" \
    | xargs -r timeout 300 docker -H "unix://$RUN/$n.sock" rmi -f >/dev/null 2>&1 || true
done
# One image, one id on every node, as a registry pull gives: imported once (an import is a new
# image each time: its creation time is part of its id), then copied to the other nodes.
image_id() { timeout 60 docker -H "unix://$RUN/$1.sock" image inspect --format '{{.Id}}' "$TAG" 2>/dev/null; }
first=${NODES[0]}
if ! image_id "$first" >/dev/null; then
  log "docker on $first: importing $TAG"
  timeout 1800 docker -H "unix://$RUN/$first.sock" import "${CHANGES[@]}" "$TARBALL" "$TAG" >/dev/null \
    || die "docker import on $first failed"
fi
ref=$(image_id "$first") || die "docker on $first has no $TAG after importing it"
pids=()
for n in "${NODES[@]:1}"; do
  [ "$(image_id "$n" || true)" = "$ref" ] && continue
  log "docker on $n: loading $TAG from $first"
  timeout 300 docker -H "unix://$RUN/$n.sock" rmi -f "$TAG" >/dev/null 2>&1 || true
  { timeout 1800 docker -H "unix://$RUN/$first.sock" save "$TAG" \
      | timeout 1800 docker -H "unix://$RUN/$n.sock" load >/dev/null; } &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || die "copying $TAG to a node's dockerd failed"; done
for n in "${NODES[@]}"; do
  [ "$(image_id "$n" || true)" = "$ref" ] || die "docker on $n does not have $TAG as $ref"
done
log "image $TAG is on podman and on the dockerd of ${NODES[*]}"
