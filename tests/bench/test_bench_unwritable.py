"""`pdbench bench` with a result directory that cannot take its files, on real filesystems: a
read-only or full one is found before any request is sent; a disk that fills mid-run keeps the
point's measurements in a spare file, and the error names both files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bench_fake_server import FakeServer
from helpers.small_fs import fill, tmpfs

from harness import tiny_model

pytestmark = pytest.mark.timeout(120)

SPARE_DIR = "pdbench-unwritten"  # harness.bench.results.SPARE_DIR, under $TMPDIR

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


def _bench(
    model_dir: str, url: str, result_dir: Path, tmp: Path, concurrency: str = "2"
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "harness", "bench", "--base-url", url, "--model", "tiny"]
    argv += ["--tokenizer", model_dir, "--isl", "16", "--osl", "8", "--concurrency", concurrency]
    argv += ["--num-prompts", "16", "--results-dir", str(result_dir), "--workers", "1", "--progress", "plain"]
    env = os.environ | {"TMPDIR": str(tmp)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=REPO, env=env)


@pytest.mark.parametrize("state", ["read-only", "full"])
def test_an_unwritable_result_dir_is_found_before_any_request(model_dir: str, tmp_path: Path, state: str) -> None:
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "64k", read_only=state == "read-only"), FakeServer() as srv:
        if state == "full":
            fill(mnt / "ballast")
        # Precondition: the filesystem refuses a new file's bytes.
        with pytest.raises(OSError), open(mnt / "try", "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
        r = _bench(model_dir, srv.base_url, mnt / "results", tmp_path)
        sent = len(srv.bodies)
    assert r.returncode == 1, r.stdout + r.stderr
    why = "Read-only file system" if state == "read-only" else "No space left on device"
    assert f"result_dir {mnt / 'results'} cannot take a result file ({why}" in r.stderr, r.stderr
    assert "nothing was sent" in r.stderr and "Traceback" not in r.stderr
    assert sent == 0


def test_a_disk_that_fills_mid_run_keeps_the_point_and_names_the_file(model_dir: str, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    # Two pages: room for the probe before the load, not for the point's result.
    with tmpfs(mnt, "8k"), FakeServer() as srv:
        r = _bench(model_dir, srv.base_url, mnt, tmp_path, "2,4")
        sent = len(srv.bodies)
        left = sorted(p.name for p in mnt.iterdir())
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stdout + r.stderr
    assert "cannot write " + str(mnt) in err and "No space left on device" in err, err
    (spare,) = (tmp_path / SPARE_DIR).iterdir()
    assert f"the point's result was written to {spare} instead" in err, err
    result = json.loads(spare.read_text())
    assert result["max_concurrency"] == 2 and result["completed"] == 16 and result["failed"] == 0
    # The sweep stopped there: C=4 sent nothing (C=2's 4 warm-ups and 16 requests).
    assert sent == 20 and "C=4 (not run: results cannot be written" in err, err
    assert left == [] and "Traceback" not in err
