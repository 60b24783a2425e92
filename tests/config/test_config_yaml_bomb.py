"""A recipe whose YAML aliases expand without bound (a "billion laughs") is refused at once, naming
the file, instead of filling memory for minutes; anchors and aliases of ordinary size still load."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config import ConfigError, load_recipe

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


def _bomb(levels: int = 9) -> str:
    """Ten aliases per level, `levels` deep: 10**levels leaves from a file of about 1 KB."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def _recipe(tmp_path: Path) -> Path:
    """The bundled local recipe with the bomb inside connector.extra_config (a free-form mapping,
    which validation accepts as it is): without the bound, rendering it walks every alias."""
    text = (REPO / "recipes" / "tiny-fp32-cpu-nixl-1p1d.yaml").read_text()
    anchor = "    kv_lease_duration: 300\n"
    assert anchor in text
    path = tmp_path / "bomb.yaml"
    path.write_text(text.replace(anchor, anchor + "".join(f"    {line}\n" for line in _bomb().splitlines())))
    return path


def test_an_alias_bomb_is_refused_in_well_under_a_second(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    assert path.stat().st_size < 4096  # the hostile file is small
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_recipe(str(path))
    took = time.perf_counter() - t0
    assert took < 0.5, took
    assert str(e.value).startswith(f"{path}: refused: its aliases expand it to ")
    assert "over the bound of 100,000 (an alias bomb?)" in str(e.value)


def _limited_memory() -> None:  # on code without the bound, the child fails fast instead of swapping
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_validate_names_the_file_in_one_line(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "harness", "validate", str(path), "--cluster", "local"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        preexec_fn=_limited_memory,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: refused: its aliases expand it to "), line


def test_ordinary_anchors_load_and_a_recursive_alias_is_refused() -> None:
    from harness.config.yaml_bounded import ExpansionError, safe_load

    data = safe_load("base: &b {tp: 1, env: {A: '1'}}\nprefill: {<<: *b, tp: 2}\ndecode: *b\n")
    assert data["prefill"] == {"tp": 2, "env": {"A": "1"}} and data["decode"] == {"tp": 1, "env": {"A": "1"}}
    with pytest.raises(ExpansionError, match="recursive alias"):
        safe_load("a: &a [1, *a]\n")
    with pytest.raises(ExpansionError, match="nested too deeply"):
        safe_load("[" * 5000 + "]" * 5000)
