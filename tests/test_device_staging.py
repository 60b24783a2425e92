"""scripts/device/: building the staging parts here, putting and installing them there.

No network: small hand-made wheels stand in for vLLM's. stage_build's resolve and download
steps (pip against PyPI) are not run here; its packing and planning are, and so is the
device step end to end (put in any order, resume, install with pip --no-index).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

DEVICE = Path(__file__).resolve().parents[1] / "scripts" / "device"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DEVICE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and the like look their module up
    spec.loader.exec_module(mod)
    return mod


build = _module("stage_build")
device = _module("stage_device")


def _wheel(out: Path, name: str, version: str, payload: bytes) -> Path:
    """A minimal valid pure-Python wheel holding module `name` (pip installs it)."""
    files = {
        f"{name}/__init__.py": b"DATA = " + repr(payload[:16]).encode() + b"\n",
        f"{name}/blob.bin": payload,
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for p, d in files.items()
    ]
    files[f"{name}-{version}.dist-info/RECORD"] = (
        "\n".join([*record, f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    ).encode()
    path = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
    return path


@pytest.fixture
def staged(tmp_path: Path) -> tuple[Path, dict]:
    wheels = tmp_path / "stage" / "wheels"
    wheels.mkdir(parents=True)
    # Incompressible payloads, so the tar (and its parts) is as large as the wheels.
    _wheel(wheels, "fakea", "1.0", bytes(range(256)) * 40 + hashlib.sha256(b"a").digest() * 100)
    _wheel(wheels, "fakeb", "2.0", hashlib.sha512(b"b").digest() * 200)
    manifest = build.pack(wheels, tmp_path / "stage", part_bytes=8192)
    return tmp_path / "stage", manifest


def test_pack_splits_into_parts_that_join_to_the_blob(staged: tuple[Path, dict]) -> None:
    out, m = staged
    parts = [out / "parts" / p["name"] for p in m["parts"]]
    assert len(parts) >= 3 and [p.name for p in parts] == [f"part-{i:03d}" for i in range(len(parts))]
    assert all(p.stat().st_size == 8192 for p in parts[:-1]) and 0 < parts[-1].stat().st_size <= 8192
    blob = b"".join(p.read_bytes() for p in parts)
    assert len(blob) == m["blob_size"] and hashlib.sha256(blob).hexdigest() == m["blob_sha256"]
    assert [w["name"] for w in m["wheels"]] == ["fakea-1.0-py3-none-any.whl", "fakeb-2.0-py3-none-any.whl"]
    assert json.loads((out / "manifest.json").read_text()) == m


def test_pack_again_rewrites_nothing_and_a_changed_set_repacks(staged: tuple[Path, dict]) -> None:
    out, m = staged
    before = {p.name: p.stat().st_mtime_ns for p in (out / "parts").iterdir()}
    assert build.pack(out / "wheels", out, part_bytes=8192) == m
    assert {p.name: p.stat().st_mtime_ns for p in (out / "parts").iterdir()} == before
    (out / "wheels" / "fakeb-2.0-py3-none-any.whl").unlink()
    m2 = build.pack(out / "wheels", out, part_bytes=8192)
    assert [w["name"] for w in m2["wheels"]] == ["fakea-1.0-py3-none-any.whl"]
    assert sorted(p.name for p in (out / "parts").iterdir()) == [p["name"] for p in m2["parts"]]  # no stale part


def test_calls_carry_the_manifest_and_parts_within_the_budget(staged: tuple[Path, dict]) -> None:
    out, m = staged
    groups = build.calls(m, out, budget_bytes=2 * 8192)
    assert all(g[0].endswith("manifest.json") and len(g) <= 3 for g in groups)
    assert [Path(p).name for g in groups for p in g[1:]] == [p["name"] for p in m["parts"]]


def test_device_put_resumes_skips_present_parts_and_refuses_bad_ones(staged: tuple[Path, dict], tmp_path: Path) -> None:
    out, m = staged
    names = [p["name"] for p in m["parts"]]
    stage = tmp_path / "device-stage"
    # A call that carried only the first part (the others are absent from its tree).
    carried = tmp_path / "call1"
    (carried / "parts").mkdir(parents=True)
    (carried / "manifest.json").write_bytes((out / "manifest.json").read_bytes())
    (carried / "parts" / names[0]).write_bytes((out / "parts" / names[0]).read_bytes())
    r = device.put(carried, stage)
    assert r == {"put": [names[0]], "kept": [], "bad": [], "missing": names[1:]}
    # A later call with everything: the first part is kept, not copied again.
    first = (stage / names[0]).stat().st_mtime_ns
    r = device.put(out, stage)
    assert r["kept"] == [names[0]] and r["put"] == names[1:] and r["missing"] == [] and r["bad"] == []
    assert (stage / names[0]).stat().st_mtime_ns == first
    # A corrupt carried part is refused, and the good staged copy stays.
    (stage / names[1]).unlink()
    bad = bytearray((out / "parts" / names[1]).read_bytes())
    bad[0] ^= 0xFF
    (carried / "parts" / names[1]).write_bytes(bytes(bad))
    r = device.put(carried, stage)
    assert r["bad"] == [names[1]] and r["missing"] == [names[1]]
    with pytest.raises(SystemExit, match=names[1]):
        device.install(stage, tmp_path / "site")


def test_device_install_installs_every_wheel_once(staged: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = staged
    stage, site = tmp_path / "device-stage", tmp_path / "site"
    assert device.put(out, stage)["missing"] == []
    assert device.install(stage, site) == ["fakea-1.0", "fakeb-2.0"]
    assert (site / "fakeb" / "blob.bin").read_bytes() == hashlib.sha512(b"b").digest() * 200
    marker = (site / device.MARKER).stat().st_mtime_ns
    assert device.install(stage, site) == ["fakea-1.0", "fakeb-2.0"]  # already there: nothing redone
    assert (site / device.MARKER).stat().st_mtime_ns == marker


def test_release_for_knows_the_default_and_the_last_release_on_torch_2_11() -> None:
    default = build.release_for(build.DEFAULT_VLLM)
    # The set shown to run on an H200 (docs/gpu.md): the default must not move.
    assert default.requirements == ["vllm==0.20.0", "nixl==1.0.1", "nixl-cu13==1.0.1", "orjson"]
    assert default.uploaded_prior_to == "2026-05-05T00:00:00Z"
    push = build.release_for("0.26.0")
    assert push.requirements == ["vllm==0.26.0", "nixl==1.3.2", "nixl-cu13==1.3.2", "orjson"]
    assert build.release_for("0.26.0", nixl="1.4.0").requirements[1:3] == ["nixl==1.4.0", "nixl-cu13==1.4.0"]


def test_release_for_refuses_an_unknown_release_without_nixl_and_date_and_a_bad_date() -> None:
    with pytest.raises(SystemExit, match=r"vLLM 0\.25\.0 is not one of .*--nixl and --uploaded-prior-to"):
        build.release_for("0.25.0", nixl="1.3.0")
    assert build.release_for("0.25.0", "1.3.0", "2026-07-15T00:00:00Z").requirements[0] == "vllm==0.25.0"
    with pytest.raises(SystemExit, match=r"--uploaded-prior-to 'July 2026' is not an ISO 8601 time"):
        build.release_for("0.26.0", uploaded_prior_to="July 2026")


FAKE_PIP = """
import json, sys
from pathlib import Path
argv = sys.argv[1:]
Path(sys.argv[0]).with_suffix(".argv").write_text(json.dumps(argv))
report = argv[argv.index("--report") + 1]
install = [{"metadata": {"name": n, "version": v}} for n, v in
           [("vllm", "0.26.0"), ("torch", "2.11.0"), ("nvidia_nvvm", "13.3.73"), ("orjson", "3.11.0")]]
Path(report).write_text(json.dumps({"install": install}))
"""


def test_resolve_asks_pip_for_the_release_and_keeps_what_the_device_lacks(tmp_path: Path) -> None:
    pip = tmp_path / "fakepip.py"
    pip.write_text(FAKE_PIP)
    device_pkgs = tmp_path / "device_pkgs.json"
    device_pkgs.write_text(json.dumps([{"name": "torch", "version": "2.11.0"}]))
    release = build.release_for("0.26.0")
    pins = build.resolve([sys.executable, str(pip)], device_pkgs, tmp_path, release)
    argv = json.loads(pip.with_suffix(".argv").read_text())
    assert argv[argv.index("--uploaded-prior-to") + 1] == "2026-07-26T00:00:00Z"
    assert argv[-4:] == release.requirements and "--dry-run" in argv
    # torch: the device has it; nvidia-nvvm: dropped (CUDA compiler for JIT kernels, 66 MiB).
    assert "nvidia-nvvm" in build.DROP
    assert pins == ["orjson==3.11.0", "vllm==0.26.0"]


def test_pack_records_the_release_and_repacks_for_another(staged: tuple[Path, dict]) -> None:
    out, m = staged
    assert m["requirements"][0] == "vllm==0.20.0" and m["uploaded_prior_to"] == "2026-05-05T00:00:00Z"
    push = build.release_for("0.26.0")
    m2 = build.pack(out / "wheels", out, part_bytes=8192, release=push)
    assert m2["requirements"] == push.requirements and m2["uploaded_prior_to"] == push.uploaded_prior_to
    assert json.loads((out / "manifest.json").read_text()) == m2


@pytest.mark.parametrize(("root", "refused"), [("out/r", True), ("out", True), ("outer/r", False)])
def test_run_all_refuses_results_under_the_calls_out_folder(tmp_path: Path, root: str, refused: bool) -> None:
    """Results written under $OUT are lost (too deep to come back, emptied before the next call)."""
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")}
    # An unknown step fails after the guard: the guard is what stops the script, or nothing does.
    r = subprocess.run(
        ["bash", str(DEVICE / "run_all.sh"), str(tmp_path / root), "no-such-step"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ("is under $OUT" in r.stderr) is refused, r.stderr
    assert (r.returncode == 2) is refused and ("unknown step no-such-step" in r.stderr) is not refused, r.stderr
