#!/usr/bin/env bash
# Add pdbench's runtime dependencies to an image's Python, run inside the image (a
# Dockerfile RUN step on a stock vLLM image, or the chroot of scripts/image/build.sh).
# pdbench itself is not installed: every job mounts its tree read-only and puts it on
# PYTHONPATH, so the code a job runs is the code that rendered it.
#   add-pdbench-deps.sh PYPROJECT_TOML
# What the image already has stays as it is (its versions are constraints), so vLLM's
# pins win; a dependency that cannot be satisfied next to them fails the build here, not
# a job on the cluster.
set -euo pipefail
PY=${PYTHON:-python3}
if [ $# != 1 ] || [ ! -f "$1" ]; then echo "usage: add-pdbench-deps.sh PYPROJECT_TOML" >&2; exit 2; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" - "$1" > "$work/requirements.txt" <<'PYEOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
# The router extra too: a recipe's proxy.kind vllm-router runs in the image's Python.
print("\n".join(project["dependencies"] + project["optional-dependencies"]["router"]))
PYEOF
# Direct references (name @ url) and editable installs cannot be constraints.
"$PY" -m pip freeze --exclude-editable | grep -v ' @ ' > "$work/constraints.txt" || true
"$PY" -m pip install --no-input -q -c "$work/constraints.txt" -r "$work/requirements.txt"
"$PY" -c "import aiohttp, pydantic, typer, jinja2, yaml, psutil, httptools, zmq, prometheus_client, vllm_router.launch_router"
echo "pdbench's dependencies are importable by $("$PY" -c 'import sys; print(sys.executable)')"
