"""What pdbench tells a new user to type next works as printed: the `next:` hint names the
command that runs here (not `pdbench` when only `.venv/bin/pdbench` exists)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli_run import pdbench
from helpers.run_dirs import finished_point, recipe_runs

ROOT = Path(__file__).resolve().parents[2]
SLURM = "dsr1-fp8-mi355x-moriio-1p2d"  # renders without a model or vLLM here (--skip-flag-check)
VENV_BIN = Path(sys.executable).parent
pytestmark = pytest.mark.timeout(240)


def _run_with_a_point(results: Path) -> str:
    """A submitted run (its dry run, unmarked) with one finished point: status says `next:`."""
    argv = ["submit", "-r", SLURM, "--dry-run", "--skip-flag-check", "--results-dir", str(results)]
    r = pdbench(*argv, "--set", "benchmark.concurrency=[1]")
    assert r.returncode == 0, r.stderr
    (run,) = recipe_runs(results, SLURM)
    finished_point(run, 1)
    run.not_submitted.unlink()
    assert not run.never_submitted
    return f"{SLURM}/{run.short_id}"


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _hint(cmd: list[str], ref: str, results: Path, path: str) -> str:
    env = dict(os.environ, PATH=path)
    r = subprocess.run(
        [*cmd, "status", ref, "--results-dir", str(results)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("next: ")]
    return line.removeprefix("next: ")


@pytest.mark.skipif(not (VENV_BIN / "pdbench").is_file(), reason="needs the venv's pdbench script")
def test_next_hint_runs_as_printed(tmp_path: Path) -> None:
    results = tmp_path / "results"
    ref = _run_with_a_point(results)
    bare = "/usr/bin:/bin"
    assert subprocess.run(["sh", "-c", "command -v pdbench"], env={"PATH": bare}).returncode != 0  # not on PATH
    script, python = VENV_BIN / "pdbench", Path(sys.executable)
    cases = [  # how it was run, PATH, the hint: a path under ROOT (where the user is) shown relative
        ([str(script)], bare, f"{_shown(script)} report {ref}"),
        ([str(python), "-m", "harness"], bare, f"{_shown(python)} -m harness report {ref}"),
        ([str(python), "-m", "harness"], f"{VENV_BIN}{os.pathsep}{bare}", f"pdbench report {ref}"),
    ]
    for cmd, path, want in cases:
        hint = _hint(cmd, ref, results, path)
        assert hint.startswith(want), (cmd, hint)
        # Typed into a shell where the user is, with the same PATH, the hint reports the run.
        r = subprocess.run(
            ["sh", "-c", hint], capture_output=True, text=True, timeout=120, env=dict(os.environ, PATH=path), cwd=ROOT
        )
        assert r.returncode == 0, (hint, r.stdout + r.stderr)
        assert ref.partition("/")[2] in r.stdout and "## Results" in r.stdout, r.stdout
