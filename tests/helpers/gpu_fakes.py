"""A fake `nvidia-smi` for the preflight and doctor tests: the queries they make, answered from a JSON file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

FAKE_NVIDIA_SMI = """\
import json, sys
data = json.load(open({data!r}))
args = sys.argv[1:]
def fields(prefix):
    return next(a.split("=", 1)[1].split(",") for a in args if a.startswith(prefix))
if "--format=csv,noheader,nounits" not in args:
    sys.exit("unexpected format")
if any(a.startswith("--query-gpu=") for a in args):
    rows, cols = data["gpus"], fields("--query-gpu=")
elif any(a.startswith("--query-compute-apps=") for a in args):
    rows, cols = data["apps"], fields("--query-compute-apps=")
else:
    sys.exit(2)
for c in cols:
    if rows and c not in rows[0]:
        print(f'Field "{{c}}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
for r in rows:
    print(", ".join(str(r[c]) for c in cols))
"""


def fake_tool(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / name
    exe.write_text(body)
    exe.chmod(0o755)


def fake_nvidia_smi(
    tmp_path: Path, n: int, apps: list[tuple[int, int, str]] = (), used: dict[int, int] | None = None
) -> dict:
    """An `nvidia-smi` that answers --query-gpu / --query-compute-apps with the asked-for
    columns, as `--format=csv,noheader,nounits` prints them: '0, GPU-0000-..., 3'.
    apps: (gpu index, pid, used_memory MiB as printed, e.g. "71234" or "[N/A]")."""
    uuid = "GPU-{:04d}-8a4f-2c1e-9b7d-5e6f7a8b9c0d".format
    gpus = [
        {"index": i, "uuid": uuid(i), "memory.used": (used or {}).get(i, 3), "name": "NVIDIA H100 80GB HBM3"}
        for i in range(n)
    ]
    rows = [{"gpu_uuid": uuid(g), "pid": pid, "used_memory": mem, "process_name": "python3"} for g, pid, mem in apps]
    data = tmp_path / "nvidia.json"
    data.write_text(json.dumps({"gpus": gpus, "apps": rows}))
    fake_tool(tmp_path / "bin", "nvidia-smi", f"#!{sys.executable}\n" + FAKE_NVIDIA_SMI.format(data=str(data)))
    return {"PATH": str(tmp_path / "bin")}
