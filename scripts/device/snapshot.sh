#!/usr/bin/env bash
# The project as committed (HEAD), plus the named working-tree paths, as one archive a device
# call carries: the job there then runs this tree, not whatever else is uncommitted here.
#   bash scripts/device/snapshot.sh [PATH...]     -> .cache/device-src.tar.gz
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive HEAD | tar -x -C "$tmp"
# The archive has no .git: the commit for the runs' records (harness.render.job.COMMIT_FILE).
git rev-parse HEAD >"$tmp/.pdbench-commit"
for p in "$@"; do mkdir -p "$tmp/$(dirname "$p")"; cp -r "$p" "$tmp/$(dirname "$p")/"; done
mkdir -p .cache
tar -czf .cache/device-src.tar.gz.tmp -C "$tmp" .
mv .cache/device-src.tar.gz.tmp .cache/device-src.tar.gz
echo "snapshot: HEAD $(git rev-parse --short HEAD) + $# path(s): $(du -h .cache/device-src.tar.gz | cut -f1)"
