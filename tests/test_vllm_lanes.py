"""scripts/test.sh runs the real-vLLM tests as two pytest processes at once, `--lane
slurm,connector` beside `--lane local`, then `--lane alone` (tests/conftest.py VLLM_LANES):
each lane must select exactly its modules' tests, and a lane that does not exist must stop the
run, not select nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import VLLM_LANES

ROOT = Path(__file__).resolve().parents[1]
MODULES = [
    "tests/e2e/test_slurm.py",
    "tests/e2e/test_e2e_vllm.py",
    "tests/e2e/test_connector_e2e.py",
    "tests/e2e/test_search_e2e.py",
]


def _collect(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _modules(out: str) -> set[str]:
    return {line.split("::")[0] for line in out.splitlines() if "::" in line}


def test_the_lanes_select_their_modules_and_together_all() -> None:
    selected: list[set[str]] = []
    for lanes in ("slurm,connector", "local", "alone"):  # as scripts/test.sh runs them
        r = _collect("-m", "vllm", "--lane", lanes, *MODULES)
        assert r.returncode == 0, r.stdout + r.stderr
        want = {m for m in MODULES if VLLM_LANES[Path(m).name] in lanes.split(",")}
        assert _modules(r.stdout) == want, (lanes, r.stdout)
        selected.append(want)
    assert set().union(*selected) == set(MODULES) and sum(map(len, selected)) == len(MODULES)


def test_an_unknown_lane_is_a_usage_error() -> None:
    r = _collect("-m", "vllm", "--lane", "slurm,nowhere", MODULES[0])
    assert r.returncode == 4, r.stdout + r.stderr
    assert "--lane nowhere: no such lane in tests/conftest.py VLLM_LANES" in r.stderr


def test_a_module_of_real_vllm_tests_outside_e2e_is_a_usage_error(tmp_path: Path) -> None:
    # The suite's own conftest over a small tree: one vllm-marked module in bench/, one in e2e/.
    tests = tmp_path / "tests"
    for folder in ("bench", "e2e"):
        (tests / folder).mkdir(parents=True)
        (tests / folder / f"test_{folder}_marked.py").write_text(
            "import pytest\n\n@pytest.mark.vllm\ndef test_x():\n    pass\n"
        )
    lanes = {"test_e2e_marked.py": "local", "test_bench_marked.py": "local"}
    (tests / "conftest.py").write_text(
        (ROOT / "tests" / "conftest.py").read_text() + f"\nVLLM_LANES.update({lanes!r})\n"
    )
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    ok = subprocess.run([*cmd, "tests/e2e"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "test_e2e_marked.py::test_x" in ok.stdout, ok.stdout + ok.stderr  # precondition
    r = subprocess.run([*cmd, "tests"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "test_bench_marked.py: a module of real-vLLM tests (marker vllm) belongs in tests/e2e/" in r.stderr
