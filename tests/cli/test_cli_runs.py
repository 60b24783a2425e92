"""Runs are what they say: a dry run or a failed sbatch is marked never submitted and is never a
recipe's latest run; runs are named by short id; `submit` ends with its points and the next command."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import port_base
from helpers.cli_run import pdbench as _cli
from helpers.run_dirs import finished_point, recipe_runs
from helpers.small_fs import tmpfs

from harness.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]
LOCAL = "tiny-fp32-cpu-nixl-1p1d"
SLURM = "dsr1-fp8-mi355x-moriio-1p2d"  # renders without a model or vLLM here (--skip-flag-check)
pytestmark = pytest.mark.timeout(240)


def _only_new(results: Path, recipe: str, before: list[RunDir]) -> RunDir:
    (new,) = [r for r in recipe_runs(results, recipe) if r not in before]
    return new


def _dry_run(results: Path) -> RunDir:
    before = recipe_runs(results, LOCAL)
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
    (run,) = recipe_runs(results, SLURM)
    assert f"run directory {run.path} kept, marked never submitted" in r.stderr
    assert "Traceback" not in r.stderr

    r = _cli("status", f"{SLURM}/{run.short_id}", "--results-dir", str(results))
    assert r.returncode == 0, r.stderr
    assert "never submitted: sbatch failed (1): sbatch: error: invalid partition specified: h200;" in r.stdout
    r = _cli("status", SLURM, "--results-dir", str(results))
    assert r.returncode == 2 and "no submitted run" in r.stderr, r.stderr


def _local_submit(tmp_path: Path, vllm: str, health_s: int) -> subprocess.CompletedProcess:
    """`submit --launcher local` of the local recipe, its `vllm` the stand-in script VLLM (first on
    the nodes' PATH, beside a `python` that is the real one), on ports of this test's own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "vllm").write_text("#!/usr/bin/env bash\n" + vllm)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    base = port_base(22500)
    sets = [
        f"topology.prefill.port={base}",
        f"topology.decode.port={base + 10}",
        f"connector.side_channel_port={base + 20}",
        f"proxy.port={base + 30}",
        f"timeouts.health_s={health_s}",
        "timeouts.teardown_s=5",
    ]
    argv = [
        "submit",
        "-r",
        LOCAL,
        "--launcher",
        "local",
        "--skip-flag-check",
        "--results-dir",
        str(tmp_path / "results"),
    ]
    argv += [a for s in sets for a in ("--set", s)]
    return _cli(*argv, env=dict(os.environ, PDBENCH_PYTHON=str(bin_dir / "python")), timeout=180)


def test_a_launched_run_is_the_latest_and_ends_with_its_points(tmp_path: Path) -> None:
    results = tmp_path / "results"
    r = _local_submit(tmp_path, 'echo "stand-in vllm: no GPU here" >&2\nexit 1\n', health_s=60)
    assert r.returncode == 1, r.stdout + r.stderr
    (launched,) = recipe_runs(results, LOCAL)
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
    assert "reason: " in out and re.search(rf"^logs: .* logs {re.escape(ref)}$", out, re.M), out
    assert "next: " not in out  # nothing to report

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
    # Both named, in whichever order the runs are listed (the recipe names' order is not the point).
    named = re.search(rf"{dry.short_id}: names 2 runs \((\S+), (\S+)\); name one as recipe/run-id", r.stderr)
    assert named is not None, r.stderr
    assert sorted(named.groups()) == sorted([f"other-recipe/{dry.run_id}", f"{LOCAL}/{dry.run_id}"]), r.stderr
    r = _cli("status", f"other-recipe/{dry.short_id}", "--results-dir", str(results))
    assert r.returncode == 0 and r.stdout.startswith(f"run: {twin}\n"), r.stdout + r.stderr


def _resume(results: Path, old: RunDir, *sets: str) -> tuple[subprocess.CompletedProcess, RunDir]:
    before = recipe_runs(results, SLURM)
    argv = ["submit", "-r", SLURM, "--dry-run", "--skip-flag-check", "--results-dir", str(results)]
    r = _cli(*argv, *(a for s in sets for a in ("--set", s)), "--resume", str(old.path))
    assert r.returncode == 0, r.stderr
    return r, _only_new(results, SLURM, before)


def test_resume_says_which_points_it_keeps_and_which_it_measures(tmp_path: Path) -> None:
    results = tmp_path / "results"
    r = _cli(
        "submit",
        "-r",
        SLURM,
        "--dry-run",
        "--skip-flag-check",
        "--results-dir",
        str(results),
        "--set",
        "benchmark.concurrency=[1,2]",
    )
    assert r.returncode == 0, r.stderr
    (old,) = recipe_runs(results, SLURM)
    for c in (1, 2):
        finished_point(old, c)

    # Every point of the same sweep is finished: nothing is submitted, and the run says so.
    r, new = _resume(results, old, "benchmark.concurrency=[1,2]")
    assert r.stdout.splitlines()[1:] == [
        f"resuming {old.path}: 2 finished point(s) kept (copied into the new run); "
        "the sweep reuses 2 and measures 0 of its 2 point(s)",
        "  reused:  C=1, C=2",
        "  measure: none",
        "nothing to measure: every point of the sweep is kept; nothing submitted",
    ], r.stdout
    assert new.never_submitted and "sbatch" not in r.stdout
    r = _cli("status", f"{SLURM}/{new.short_id}", "--results-dir", str(results))
    assert f"never submitted: nothing to measure: every point is kept from {old.path};" in r.stdout, r.stdout

    # A wider sweep measures only the new point.
    r, _ = _resume(results, old, "benchmark.concurrency=[1,2,4]")
    assert "the sweep reuses 2 and measures 1 of its 3 point(s)\n  reused:  C=1, C=2\n  measure: C=4\n" in r.stdout

    # Another output length invalidates every kept point: each is measured again, and says why.
    cfg = json.loads(old.bench_config().read_text())
    r, _ = _resume(results, old, "benchmark.concurrency=[1,2]", f"benchmark.osl={cfg['osl'] * 2}")
    assert "the sweep reuses 0 and measures 2 of its 2 point(s)\n  reused:  none\n" in r.stdout, r.stdout
    why = f"made with other settings: random_output_len {cfg['osl']} (now {cfg['osl'] * 2})"
    assert f"  measure: C=1 ({why}), C=2 ({why})\n" in r.stdout, r.stdout

    # A narrower sweep keeps the other finished point in the run, outside the sweep.
    r, _ = _resume(results, old, "benchmark.concurrency=[2,8]")
    assert "reuses 1 and measures 1 of its 2 point(s)\n  reused:  C=2\n  measure: C=8\n" in r.stdout, r.stdout
    assert "  (1 kept point(s) are outside this sweep: reported, not measured)" in r.stdout


def test_submit_shows_the_health_wait(tmp_path: Path) -> None:
    # Servers that load for longer than the wait allows: the job fails at its health timeout,
    # having said along the way who it waits for and what their logs say.
    loading = 'echo "Loading safetensors checkpoint shards: 40% Completed | 2/5"\nexec sleep 300\n'
    r = _local_submit(tmp_path, loading, health_s=25)
    assert r.returncode == 1, r.stdout + r.stderr
    waits = re.findall(r"health wait (\d+):(\d\d): (.*)\n  (.*)\n", r.stdout)
    assert waits, r.stdout
    minutes, seconds, who, last = waits[0]
    assert 10 <= 60 * int(minutes) + int(seconds) < 25, waits
    assert who == "0 of 3 ready; waiting for prefill-0, decode-0, proxy", waits
    assert last == "prefill-0: Loading safetensors checkpoint shards: 40% Completed | 2/5", waits
    assert "not healthy within 25 s" in r.stdout, r.stdout


@pytest.mark.parametrize("where", ["through a file", "read-only filesystem"])
def test_submit_refuses_a_results_dir_it_cannot_create(tmp_path: Path, where: str) -> None:
    """One line naming the path and why, exit 2, no traceback, and no run started."""
    if where == "through a file":
        (tmp_path / "file").write_text("not a directory\n")
        results, why, ctx = tmp_path / "file" / "results", "Not a directory", contextlib.nullcontext(tmp_path)
    else:
        results, why, ctx = tmp_path / "ro" / "results", "Read-only file system", tmpfs(tmp_path / "ro", read_only=True)
    with ctx:
        # Precondition: the path really cannot be created.
        with pytest.raises(OSError):
            results.mkdir(parents=True)
        r = _cli(
            "submit",
            "-r",
            LOCAL,
            "--launcher",
            "local",
            "--dry-run",
            "--skip-flag-check",
            "--results-dir",
            str(results),
        )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    # One line (beside the note of a first run that builds the tiny model).
    lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("building the tiny model")]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: --results-dir {results}: cannot create a run directory under it: {why}"), lines
    assert "run directory:" not in r.stdout
