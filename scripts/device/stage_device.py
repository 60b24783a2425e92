"""Run on the GPU machine: put carried parts under /tmp/pdbench-stage, then install (docs/gpu.md).

    python3 scripts/device/stage_device.py put [--src .cache/device-stage]
    python3 scripts/device/stage_device.py install [--target /tmp/pdbench-site]

`put` copies the parts this call carried (OUT/parts/part-NNN of stage_build.py) that the
stage lacks, after checking each one's sha256 against the manifest, and prints what is
still missing: calls can come in any order and repeat. `install` joins the parts, checks
the whole, and installs every wheel with `pip install --no-index --no-deps --target`;
it does nothing when that set is installed already. Standard library only (the machine's
python3 has no pdbench yet).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

STAGE = Path("/tmp/pdbench-stage")
TARGET = Path("/tmp/pdbench-site")
MARKER = ".pdbench-stage-installed"
PIP_TIMEOUT_S = 600


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(path: Path) -> dict[str, Any]:
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"stage_device: cannot read the manifest {path}: {e}") from None
    if m.get("format") != 1 or not isinstance(m.get("parts"), list):
        raise SystemExit(f"stage_device: {path} is not a stage manifest (format 1)")
    return dict(m)


def _good(path: Path, part: dict[str, Any]) -> bool:
    return path.is_file() and path.stat().st_size == part["size"] and sha256_file(path) == part["sha256"]


def missing(manifest: dict[str, Any], stage: Path) -> list[str]:
    return [p["name"] for p in manifest["parts"] if not _good(stage / p["name"], p)]


def put(src: Path, stage: Path) -> dict[str, list[str]]:
    """Copy the carried parts the stage lacks; return which were put, kept, bad, still missing."""
    manifest = load_manifest(src / "manifest.json")
    stage.mkdir(parents=True, exist_ok=True)
    old = stage / "manifest.json"
    if old.is_file() and load_manifest(old)["blob_sha256"] != manifest["blob_sha256"]:
        # Another set was staged here: its parts are of no use to this one.
        for p in stage.glob("part-*"):
            p.unlink()
    shutil.copyfile(src / "manifest.json", stage / "manifest.json.tmp")
    os.replace(stage / "manifest.json.tmp", stage / "manifest.json")
    done: dict[str, list[str]] = {"put": [], "kept": [], "bad": []}
    for part in manifest["parts"]:
        dst, carried = stage / part["name"], src / "parts" / part["name"]
        if _good(dst, part):
            done["kept"].append(part["name"])
        elif carried.is_file():
            if not _good(carried, part):
                done["bad"].append(part["name"])
                continue
            shutil.copyfile(carried, dst.with_suffix(".tmp"))
            os.replace(dst.with_suffix(".tmp"), dst)
            done["put"].append(part["name"])
    done["missing"] = missing(manifest, stage)
    return done


def install(stage: Path, target: Path, python: str = sys.executable) -> list[str]:
    """Join, check and install the staged wheels; return the installed `name-version`s."""
    manifest = load_manifest(stage / "manifest.json")
    lacking = missing(manifest, stage)
    if lacking:
        raise SystemExit(f"stage_device: parts missing under {stage}: {' '.join(lacking)} (carry them, then `put`)")
    marker = target / MARKER
    if not (marker.is_file() and marker.read_text().strip() == manifest["blob_sha256"]):
        blob = stage / "wheels.tar"
        h = hashlib.sha256()
        with blob.open("wb") as out:
            for part in manifest["parts"]:
                data = (stage / part["name"]).read_bytes()
                h.update(data)
                out.write(data)
        if h.hexdigest() != manifest["blob_sha256"]:
            raise SystemExit("stage_device: the joined parts do not match the manifest's blob_sha256")
        wheels = stage / "wheels"
        shutil.rmtree(wheels, ignore_errors=True)
        with tarfile.open(blob) as tar:
            tar.extractall(wheels, filter="data")
        blob.unlink()
        files = sorted(str(wheels / w["name"]) for w in manifest["wheels"])
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                str(target),
                *files,
            ],
            check=True,
            timeout=PIP_TIMEOUT_S,
        )
        shutil.rmtree(wheels, ignore_errors=True)
        marker.write_text(manifest["blob_sha256"] + "\n")
    return sorted(p.name.removesuffix(".dist-info") for p in target.glob("*.dist-info"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["put", "install"])
    ap.add_argument("--src", type=Path, default=Path(".cache/device-stage"), help="what this call carried")
    ap.add_argument("--stage", type=Path, default=STAGE)
    ap.add_argument("--target", type=Path, default=TARGET)
    a = ap.parse_args(argv)
    if a.step == "put":
        r = put(a.src, a.stage)
        print("stage_device put: " + "; ".join(f"{k} {' '.join(v) or '-'}" for k, v in r.items()))
        return 1 if r["bad"] else 0
    names = install(a.stage, a.target)
    print(f"stage_device install: {len(names)} packages in {a.target}: {' '.join(names)}")
    print(f'use: export PYTHONPATH={a.target}:"$PWD" PATH={a.target}/bin:"$PATH"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
