"""PDBENCH_REQUIRE_CUDA turns tests/connector/test_connector_cuda.py's skips into failures, both as a
script (how the device machine runs it) and under pytest. CUDA is hidden from the child
(CUDA_VISIBLE_DEVICES=""), so this holds on a GPU machine too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CUDA_TESTS = "tests/connector/test_connector_cuda.py"


def _run(args: list[str], require: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PDBENCH_REQUIRE_CUDA", "PYTEST_ADDOPTS")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    if require is not None:
        env["PDBENCH_REQUIRE_CUDA"] = require
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_script_skips_without_cuda_unless_required() -> None:
    skipped = _run([CUDA_TESTS], None)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "no CUDA: skipped" in skipped.stdout
    off = _run([CUDA_TESTS], "0")  # "0" is the same as unset
    assert off.returncode == 0 and "no CUDA: skipped" in off.stdout, off.stdout + off.stderr
    required = _run([CUDA_TESTS], "1")
    assert required.returncode == 1, required.stdout + required.stderr
    assert "FAIL: PDBENCH_REQUIRE_CUDA is set but torch" in required.stdout
    assert "sees no CUDA device (CUDA_VISIBLE_DEVICES='')" in required.stdout


def test_pytest_fails_every_test_when_cuda_is_required() -> None:
    args = ["-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", CUDA_TESTS]
    skipped = _run(args, None)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert " skipped" in skipped.stdout and "passed" not in skipped.stdout and "error" not in skipped.stdout
    required = _run([*args, "-rE"], "1")
    assert required.returncode == 1, required.stdout + required.stderr
    assert "passed" not in required.stdout and "skipped" not in required.stdout
    # Each test stops at the requirement, with its reason, before touching CUDA.
    tests = (ROOT / CUDA_TESTS).read_text().count("\ndef test_")
    assert tests >= 7 and f"{tests} errors" in required.stdout, required.stdout
    assert required.stdout.count("PDBENCH_REQUIRE_CUDA is set but torch") >= tests, required.stdout
