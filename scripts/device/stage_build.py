"""Build, here, the parts that install vLLM on a bare GPU machine with no network (docs/gpu.md).

    python scripts/device/stage_build.py --device-pkgs device_pkgs.json [--out .cache/device-stage]
        [--vllm 0.26.0 [--nixl 1.3.2 --uploaded-prior-to 2026-07-26T00:00:00Z]]

1. resolve: vLLM (0.20.0 unless --vllm) + NIXL for CUDA 13 (+ pdbench's runtime deps) for
   CPython 3.12 on manylinux x86-64, as PyPI had them on one date (reproducible), with pip's resolver;
   keep what the device lacks (its `pip list --format=json`), minus the large packages
   vLLM imports only for features the GPU recipes do not use (DROP);
2. download those wheels (`pip download --no-deps`) into OUT/wheels (present ones are kept);
3. pack: one uncompressed tar of the wheels (wheels are compressed already), split into
   parts of at most --part-mib under OUT/parts, and OUT/manifest.json with every size and
   sha256. A rerun with the same wheels rewrites nothing.

Each device call then carries OUT/manifest.json and one part (`calls` prints the carry
lists), and scripts/device/stage_device.py puts it under /tmp/pdbench-stage there.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PYTHON_VERSION = "3.12"


@dataclass(frozen=True)
class Release:
    """One vLLM release to stage: the NIXL that goes with it and the date PyPI is read as of
    (the set resolved then stays the same)."""

    vllm: str
    nixl: str
    uploaded_prior_to: str

    @property
    def requirements(self) -> list[str]:
        return [f"vllm=={self.vllm}", f"nixl=={self.nixl}", f"nixl-cu13=={self.nixl}", "orjson"]


# Releases that match the machine's image (torch 2.11.0 built for CUDA 13: vLLM pins torch exactly,
# and torch cannot be carried). 0.20.0: shown to run on an H200 (docs/gpu.md). 0.26.0: the last
# release pinning torch 2.11.0 and so the newest the image can run; the first with NIXL's push
# connector is 0.24.0 (NixlPushConnector); NIXL and date: the newest NIXL on PyPI the day after
# its upload (2026-07-25).
RELEASES = {
    r.vllm: r
    for r in (
        Release("0.20.0", "1.0.1", "2026-05-05T00:00:00Z"),
        Release("0.26.0", "1.3.2", "2026-07-26T00:00:00Z"),
    )
}
DEFAULT_VLLM = "0.20.0"


def release_for(vllm: str, nixl: str | None = None, uploaded_prior_to: str | None = None) -> Release:
    """The release to stage: a known one (RELEASES), its NIXL or date replaced where given; any
    other vLLM needs both."""
    known = RELEASES.get(vllm)
    nixl = nixl or (known.nixl if known else None)
    date = uploaded_prior_to or (known.uploaded_prior_to if known else None)
    if nixl is None or date is None:
        raise SystemExit(
            f"stage_build: vLLM {vllm} is not one of {sorted(RELEASES)}: give --nixl and --uploaded-prior-to"
        )
    try:
        datetime.fromisoformat(date)
    except ValueError:
        raise SystemExit(
            f"stage_build: --uploaded-prior-to {date!r} is not an ISO 8601 time (2026-07-26T00:00:00Z)"
        ) from None
    return Release(vllm, nixl, date)


# Imported by vLLM only for kernels, tools or telemetry the GPU recipes do not use (FlashInfer,
# CUTLASS DSL, TileLang, ...): 1.5 GB that would need 25 more calls. nixl-cu12: nixl's
# CUDA 12 build, the device runs CUDA 13. apache-tvm-ffi stays: xgrammar imports it at start.
# Later releases (0.26.0) add: CUTLASS DSL's libraries, split out of it; the CUDA compiler that
# humming-kernels' cu13 extra pulls (nvcc, nvvm, crt, cccl: JIT of quantized kernels; humming
# stays, vLLM checks has_humming); tokenspeed-mla and its Triton fork (DeepSeek-R1 MLA only);
# PyNvVideoCodec (video inputs, imported where a video is decoded). 411 MiB, 8 calls.
DROP = frozenset(
    {
        "flashinfer-python",
        "flashinfer-cubin",
        "nvidia-cutlass-dsl",
        "nvidia-cutlass-dsl-libs-base",
        "nvidia-cutlass-dsl-libs-core",
        "nvidia-cutlass-dsl-libs-cu12",
        "nvidia-cutlass-dsl-libs-cu13",
        "nvidia-cuda-nvcc",
        "nvidia-nvvm",
        "nvidia-cuda-crt",
        "nvidia-cuda-cccl",
        "nvidia-cuda-nvdisasm",
        "tokenspeed-mla",
        "tokenspeed-triton",
        "pynvvideocodec",
        "quack-kernels",
        "tilelang",
        "z3-solver",
        "cuda-tile",
        "fastsafetensors",
        "sentry-sdk",
        "fastapi-cloud-cli",
        "fastar",
        "rignore",
        "nixl-cu12",
    }
)
# The whole working tree travels with every call (64 MiB in all): a part leaves room for it.
PART_MIB = 56
PIP_TIMEOUT_S = 900


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_platform_args() -> list[str]:
    # pip matches manylinux_2_N exactly: name every glibc a wheel may ask for.
    args = ["--python-version", PYTHON_VERSION, "--implementation", "cp", "--only-binary=:all:"]
    for n in range(5, 40):
        args += ["--platform", f"manylinux_2_{n}_x86_64"]
    return [*args, "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64"]


def resolve(pip: list[str], device_pkgs: Path, work: Path, release: Release) -> list[str]:
    """`name==version` of every wheel to carry: the resolved set minus the device's and DROP."""
    have = {norm(p["name"]) for p in json.loads(device_pkgs.read_text())}
    report = work / "resolve-report.json"
    subprocess.run(
        [
            *pip,
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "--uploaded-prior-to",
            release.uploaded_prior_to,
            "--target",
            str(work / "unused"),
            *pip_platform_args(),
            *release.requirements,
        ],
        check=True,
        timeout=PIP_TIMEOUT_S,
    )
    out = []
    for item in json.loads(report.read_text())["install"]:
        meta = item["metadata"]
        name = norm(meta["name"])
        if name not in have and name not in DROP:
            out.append(f"{name}=={meta['version']}")
    return sorted(out)


def download(pip: list[str], pins: list[str], wheels: Path, uploaded_prior_to: str) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            *pip,
            "download",
            "--no-deps",
            "--quiet",
            "-d",
            str(wheels),
            "--uploaded-prior-to",
            uploaded_prior_to,
            *pip_platform_args(),
            *pins,
        ],
        check=True,
        timeout=PIP_TIMEOUT_S,
    )
    wanted = {p.split("==")[0] for p in pins}
    for w in wheels.glob("*.whl"):
        if norm(w.name.split("-")[0]) not in wanted:  # left from an earlier set: not carried
            w.unlink()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _tar_bytes(wheels: list[Path]) -> bytes:
    """A deterministic tar of the wheels: sorted names, no owners, no times."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for w in sorted(wheels, key=lambda p: p.name):
            info = tarfile.TarInfo(w.name)
            info.size = w.stat().st_size
            info.mode = 0o644
            with w.open("rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


def wheel_entries(wheels: Path) -> list[dict[str, Any]]:
    return [
        {"name": w.name, "size": w.stat().st_size, "sha256": sha256_file(w)}
        for w in sorted(wheels.glob("*.whl"), key=lambda p: p.name)
    ]


def pack(wheels: Path, out: Path, part_bytes: int, release: Release = RELEASES[DEFAULT_VLLM]) -> dict[str, Any]:
    """Split the wheels' tar into parts and write the manifest; unchanged wheels rewrite nothing."""
    entries = wheel_entries(wheels)
    if not entries:
        raise SystemExit(f"stage_build: no wheels under {wheels}")
    manifest_path = out / "manifest.json"
    if manifest_path.is_file():
        old = json.loads(manifest_path.read_text())
        if (
            old.get("wheels") == entries
            and old.get("part_bytes") == part_bytes
            and old.get("requirements") == release.requirements
            and old.get("uploaded_prior_to") == release.uploaded_prior_to
            and all(
                (out / "parts" / p["name"]).is_file() and sha256_file(out / "parts" / p["name"]) == p["sha256"]
                for p in old["parts"]
            )
        ):
            return dict(old)
    blob = _tar_bytes([wheels / e["name"] for e in entries])
    parts_dir = out / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    for stale in parts_dir.glob("part-*"):
        stale.unlink()
    parts = []
    for i, start in enumerate(range(0, len(blob), part_bytes)):
        chunk = blob[start : start + part_bytes]
        name = f"part-{i:03d}"
        _write_atomic(parts_dir / name, chunk)
        parts.append({"name": name, "size": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {
        "format": 1,
        "python": PYTHON_VERSION,
        "requirements": release.requirements,
        "uploaded_prior_to": release.uploaded_prior_to,
        "part_bytes": part_bytes,
        "blob_size": len(blob),
        "blob_sha256": hashlib.sha256(blob).hexdigest(),
        "parts": parts,
        "wheels": entries,
    }
    _write_atomic(manifest_path, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def calls(manifest: dict[str, Any], out: Path, budget_bytes: int) -> list[list[str]]:
    """The carry list of each device call: the manifest and as many parts as fit the budget."""
    rel = out.resolve().relative_to(REPO) if out.resolve().is_relative_to(REPO) else out
    groups: list[list[str]] = []
    size = budget_bytes + 1
    for p in manifest["parts"]:
        if size + p["size"] > budget_bytes or len(groups[-1]) >= 8:
            groups.append([str(rel / "manifest.json")])
            size = 0
        groups[-1].append(str(rel / "parts" / p["name"]))
        size += p["size"]
    return groups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device-pkgs", type=Path, help="the device's `python3 -m pip list --format=json`")
    ap.add_argument("--out", type=Path, default=REPO / ".cache/device-stage")
    ap.add_argument("--part-mib", type=int, default=PART_MIB)
    ap.add_argument("--vllm", default=DEFAULT_VLLM, help=f"the vLLM release (known: {', '.join(RELEASES)})")
    ap.add_argument("--nixl", help="nixl and nixl-cu13's version (default: the known release's)")
    ap.add_argument("--uploaded-prior-to", help="read PyPI as of this time (default: the known release's)")
    ap.add_argument("--pip", default=f"{sys.executable} -m pip", help="pip >= 26 (it has --uploaded-prior-to)")
    ap.add_argument("--pack-only", action="store_true", help="pack OUT/wheels as they are (no network)")
    ap.add_argument("--calls", action="store_true", help="print each call's carry list (JSON) and exit")
    a = ap.parse_args(argv)
    part_bytes = a.part_mib << 20
    release = release_for(a.vllm, a.nixl, a.uploaded_prior_to)
    if a.calls:
        manifest = json.loads((a.out / "manifest.json").read_text())
        print(json.dumps(calls(manifest, a.out, part_bytes + (1 << 20))))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.pack_only:
        if a.device_pkgs is None:
            ap.error("--device-pkgs is required (or --pack-only)")
        pip = a.pip.split()
        pins = resolve(pip, a.device_pkgs, a.out, release)
        _write_atomic(a.out / "pins.txt", ("\n".join(pins) + "\n").encode())
        download(pip, pins, a.out / "wheels", release.uploaded_prior_to)
    m = pack(a.out / "wheels", a.out, part_bytes, release)
    print(
        f"vLLM {release.vllm}: {len(m['wheels'])} wheels, {m['blob_size'] / 2**20:.0f} MiB "
        f"in {len(m['parts'])} parts under {a.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
