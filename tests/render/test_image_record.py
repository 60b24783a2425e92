"""The image records the rendered job scripts write (slurm_templates/_image_record.sh.j2): the
image id docker or podman reports (a fake `docker` on PATH), and the sha256 of an image file
(enroot, apptainer); each read back by the bench client (harness.bench.runtime_info)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.bench.runtime_info import image_digest
from harness.render.job import _environment
from harness.rundir.paths import script_names

pytestmark = pytest.mark.timeout(60)

ID_A, ID_B = "a" * 64, "b" * 64


def _functions(runtime: str, hash_timeout_s: int = 600) -> str:
    """The shell functions as the job scripts include them."""
    env = _environment()
    return env.get_template("_fail.sh.j2").render(names=script_names()) + env.get_template(
        "_image_record.sh.j2"
    ).render(runtime=runtime, image_hash_timeout_s=hash_timeout_s)


def _run(tmp_path: Path, runtime: str, call: str, hash_timeout_s: int = 600) -> subprocess.CompletedProcess:
    script = tmp_path / "f.sh"
    script.write_text("set -euo pipefail\n" + _functions(runtime, hash_timeout_s) + call + "\n")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "NODE": "0", "STATE": str(tmp_path)}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)


def _fake(tmp_path: Path, name: str, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/bash\n" + body)
    (bin_dir / name).chmod(0o755)


# `RUNTIME image inspect --format FORMAT IMAGE` for two known images, as docker prints them
# (podman prints the id without "sha256:"); any other image is missing.
FAKE_RUNTIME = f"""
[ "$1 $2 $3" = "image inspect --format" ] || {{ echo "unexpected: $*" >&2; exit 2; }}
case "$5" in
  vllm/vllm-openai:v1) id={ID_A}; digests='["vllm/vllm-openai@sha256:{"d" * 64}"]' ;;
  localhost/pdbench-setup:1) id={ID_B}; digests='[]' ;;
  *) echo "Error: No such image: $5" >&2; exit 1 ;;
esac
case "$4" in
  '{{{{.Id}}}}') if [ "$(basename "$0")" = podman ]; then echo "$id"; else echo "sha256:$id"; fi ;;
  '{{{{json .RepoDigests}}}}') echo "$digests" ;;
  *) echo "unexpected format $4" >&2; exit 2 ;;
esac
"""


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_the_image_id_a_node_ran(tmp_path: Path, runtime: str) -> None:
    _fake(tmp_path, runtime, FAKE_RUNTIME)
    record = tmp_path / "image-node0.json"
    r = _run(tmp_path, runtime, f"image_id_record {record} 0 {runtime} vllm/vllm-openai:v1 vllm/vllm-openai:v1")
    assert r.returncode == 0, r.stderr
    assert json.loads(record.read_text()) == {
        "node": 0,
        "runtime": runtime,
        "image": "vllm/vllm-openai:v1",
        "ran": "vllm/vllm-openai:v1",
        "kind": "image id",
        "digest": f"sha256:{ID_A}",
        "repo_digests": [f"vllm/vllm-openai@sha256:{'d' * 64}"],
        "base_digest": None,
        "reason": None,
    }
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("image-")] == [record.name]  # no temp left


def test_set_up_steps_record_the_image_run_and_its_base(tmp_path: Path) -> None:
    _fake(tmp_path, "docker", FAKE_RUNTIME)
    record = tmp_path / "image-node1.json"
    r = _run(tmp_path, "docker", f"image_id_record {record} 1 docker vllm/vllm-openai:v1 localhost/pdbench-setup:1")
    assert r.returncode == 0, r.stderr
    rec = json.loads(record.read_text())
    assert (rec["digest"], rec["base_digest"], rec["repo_digests"]) == (f"sha256:{ID_B}", f"sha256:{ID_A}", [])
    assert image_digest(tmp_path, "docker")["digest"] == f"sha256:{ID_B}"


def test_an_image_the_runtime_cannot_inspect_is_null_with_the_reason(tmp_path: Path) -> None:
    _fake(tmp_path, "docker", FAKE_RUNTIME)
    record = tmp_path / "image-node0.json"
    # A name with quotes and a backslash still makes valid JSON.
    r = _run(tmp_path, "docker", f"""image_id_record {record} 0 docker 'odd"\\name' 'odd"\\name'""")
    assert r.returncode == 0, r.stderr  # recording never fails the job
    rec = json.loads(record.read_text())
    assert rec["image"] == 'odd"\\name' and rec["digest"] is None and rec["repo_digests"] is None
    assert rec["reason"] == 'docker image inspect odd"\\name: Error: No such image: odd"\\name'
    got = image_digest(tmp_path, "docker")
    assert got["digest"] is None and got["reason"] == f"node0: {rec['reason']}"


def test_the_sha256_of_an_image_file(tmp_path: Path) -> None:
    image = tmp_path / "vllm image.sqsh"
    image.write_bytes(os.urandom(300_000))
    record = tmp_path / "image-job.json"
    r = _run(tmp_path, "enroot", f'image_file_record {record} enroot "{image}"')
    assert r.returncode == 0, r.stderr
    rec = json.loads(record.read_text())
    assert rec["digest"] == "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()
    assert (rec["node"], rec["runtime"], rec["kind"], rec["image"], rec["reason"]) == (
        None,
        "enroot",
        "file sha256",
        str(image),
        None,
    )
    assert isinstance(rec["hash_s"], int)
    assert image_digest(tmp_path, "enroot") == {"digest": rec["digest"], "reason": None, "records": {"job": rec}}


def test_a_registry_reference_or_a_slow_hash_is_null_with_the_reason(tmp_path: Path) -> None:
    record = tmp_path / "image-job.json"
    r = _run(tmp_path, "enroot", f"image_file_record {record} enroot 'nvcr.io#nvidia/vllm:25.01'")
    assert r.returncode == 0, r.stderr
    rec = json.loads(record.read_text())
    assert rec["digest"] is None and rec["reason"].startswith("nvcr.io#nvidia/vllm:25.01 is not a file on ")
    # The hash is bounded: a sha256sum that takes too long is given up, and said so.
    _fake(tmp_path, "sha256sum", "exec sleep 20\n")
    image = tmp_path / "big.sif"
    image.write_bytes(b"x")
    r = _run(tmp_path, "apptainer", f"image_file_record {record} apptainer {image}", hash_timeout_s=1)
    assert r.returncode == 0, r.stderr
    rec = json.loads(record.read_text())
    assert rec["digest"] is None and rec["reason"] == f"sha256sum of {image} took over 1 s"
