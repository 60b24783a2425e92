"""Runs are what they say: a dry run or a failed sbatch is marked never submitted and is never a
recipe's latest run; runs are named by short id; `submit` ends with its points and the next command."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import port_base

from harness.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]
LOCAL = "local-tiny-1p1d"
SLURM = "dsr1-fp8-1p2d"  # renders without a model or vLLM here (--skip-flag-check)
pytestmark = pytest.mark.timeout(240)


def _cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def _runs(results: Path, recipe: str) -> list[RunDir]:
    return [RunDir(p) for p in sorted((results / recipe).iterdir())] if (results / recipe).is_dir() else []


def _only_new(results: Path, recipe: str, before: list[RunDir]) -> RunDir:
    (new,) = [r for r in _runs(results, recipe) if r not in before]
    return new


def _dry_run(results: Path) -> RunDir:
    before = _runs(results, LOCAL)
    r = _cli(
        "submit", "-r", LOCAL, "--launcher", "local", "--dry-run", "--skip-flag-check", "--results-dir", str(results)
    )
    assert r.returncode == 0, r.stderr
    assert "dry run: nothing submitted" in r.stdout, r.stdout
    return _only_new(results, LOCAL, before)


def test_a_dry_run_is_marked_and_never_the_latest(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run = _dry_run(results)
    assert RunDir.is_run_dir(run.path) and run.never_submitted and not run.launched

    r = _cli("status", LOCAL, "--results-dir", str(results))
    assert r.returncode == 2, r.stdout
    assert f"{LOCAL}: no submitted run under" in r.stderr and run.run_id in r.stderr, r.stderr

    # Named by its short id (or recipe/short id, or its run id), the dry run says what it is.
    for ref in (run.short_id, f"{LOCAL}/{run.short_id}", run.run_id):
        r = _cli("status", ref, "--results-dir", str(results))
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [
            f"run: {run.path}",
            "never submitted: a dry run (--dry-run); nothing ran, so it has no job, logs or results",
        ]
    r = _cli("cancel", run.short_id, "--results-dir", str(results))
    assert r.returncode == 1 and "never submitted (a dry run (--dry-run)): nothing to cancel" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_failed_sbatch_is_marked_never_submitted(tmp_path: Path) -> None:
    results, bin_dir = tmp_path / "results", tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text('#!/usr/bin/env bash\necho "sbatch: error: invalid partition specified: h200" >&2\nexit 1\n')
    sbatch.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    r = _cli("submit", "-r", SLURM, "--skip-flag-check", "--results-dir", str(results), env=env)
    assert r.returncode == 1, r.stdout
    assert "sbatch failed (1): sbatch: error: invalid partition specified: h200" in r.stderr, r.stderr
    (run,) = _runs(results, SLURM)
    assert f"run directory {run.path} kept, marked never submitted" in r.stderr
    assert "Traceback" not in r.stderr

    r = _cli("status", f"{SLURM}/{run.short_id}", "--results-dir", str(results))
    assert r.returncode == 0, r.stderr
    assert "never submitted: sbatch failed (1): sbatch: error: invalid partition specified: h200;" in r.stdout
    r = _cli("status", SLURM, "--results-dir", str(results))
    assert r.returncode == 2 and "no submitted run" in r.stderr, r.stderr


def _failing_vllm(bin_dir: Path) -> Path:
    """`python` (the real one) and a `vllm` that fails at once, first on the nodes' PATH."""
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "vllm").write_text('#!/usr/bin/env bash\necho "stand-in vllm: no GPU here" >&2\nexit 1\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir / "python"


def test_a_launched_run_is_the_latest_and_ends_with_its_points(tmp_path: Path) -> None:
    results = tmp_path / "results"
    base = port_base(22500)
    sets = [
        f"topology.prefill.port={base}",
        f"topology.decode.port={base + 10}",
        f"connector.side_channel_port={base + 20}",
        f"proxy.port={base + 30}",
        "timeouts.health_s=60",
        "timeouts.teardown_s=5",
    ]
    argv = ["submit", "-r", LOCAL, "--launcher", "local", "--skip-flag-check", "--results-dir", str(results)]
    argv += [a for s in sets for a in ("--set", s)]
    env = dict(os.environ, PDBENCH_PYTHON=str(_failing_vllm(tmp_path / "bin")))
    r = _cli(*argv, env=env, timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    (launched,) = _runs(results, LOCAL)
    assert launched.launched
    # The summary: every planned point (none measured), why, and where to look next.
    ref = f"{LOCAL}/{launched.short_id} --results-dir {results}"
    out = r.stdout
    assert f"FAILED (exit 1): 0 of 2 point(s) valid, in {launched.path}" in out, out
    table = [
        "  point   TTFT ms   TPOT ms   out tok/s  valid",
        "  C=1           -         -           -  no result",
        "  C=4           -         -           -  no result",
    ]
    assert "\n".join(table) in out, out
    assert "reason: " in out and f"logs: pdbench logs {ref}" in out, out
    assert "next: pdbench report" not in out  # nothing to report

    dry = _dry_run(results)  # newer, never submitted: the recipe's latest is still the launched run
    for ref in (LOCAL, launched.short_id, f"{LOCAL}/{launched.short_id}"):
        r = _cli("status", ref, "--results-dir", str(results))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"run: {launched.path}\n") and "outcome: failed" in r.stdout, r.stdout
        assert "points: 0 of 2 valid" in r.stdout, r.stdout

    # A short id two recipes' runs share is refused, naming both.
    twin = results / "other-recipe" / dry.run_id
    shutil.copytree(dry.path, twin)
    r = _cli("status", dry.short_id, "--results-dir", str(results))
    assert r.returncode == 2, r.stdout
    assert f"{dry.short_id}: names 2 runs (other-recipe/{dry.run_id}, {LOCAL}/{dry.run_id})" in r.stderr, r.stderr
    r = _cli("status", f"other-recipe/{dry.short_id}", "--results-dir", str(results))
    assert r.returncode == 0 and r.stdout.startswith(f"run: {twin}\n"), r.stdout + r.stderr
