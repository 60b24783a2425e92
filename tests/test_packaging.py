"""Building pdbench's package, as `scripts/setup.sh`'s `pip install -e .` does, prints no
setuptools deprecation banner, and the wheel's metadata carries the licence as an SPDX expression
with the LICENSE file."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)


def test_the_package_builds_without_a_deprecation_banner(tmp_path: Path) -> None:
    # The project's metadata files, and an empty package per name the package finder includes:
    # the build reads only these, and the checkout is left as it is.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("harness", "connector"):
        (src / pkg).mkdir()
        (src / pkg / "__init__.py").write_text("")
    (src / "harness" / "py.typed").write_text("")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=src,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "deprecat" not in (r.stdout + r.stderr).lower(), r.stderr  # what setup.sh showed 3 times
    (wheel,) = tmp_path.glob("pdbench-*.whl")
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = z.read(meta).decode().splitlines()
        assert "License-Expression: Apache-2.0" in lines, lines[:20]
        assert "License-File: LICENSE" in lines, lines[:20]
        assert any(n.endswith("licenses/LICENSE") for n in z.namelist()), z.namelist()
