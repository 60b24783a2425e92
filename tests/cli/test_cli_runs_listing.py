"""`pdbench status` without a run lists the recent runs like squeue; `--json` for scripts;
`logs` of a never-submitted run says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli_run import pdbench as _cli

from harness.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ("tiny-fp32-cpu-nixl-1p1d", "dsr1-fp8-h200-nixl-1p1d-wideep")  # the second: a long name
pytestmark = pytest.mark.timeout(240)


def test_status_lists_the_recent_runs(tmp_path: Path) -> None:
    results = tmp_path / "results"
    r = _cli("status", "--results-dir", str(results))
    assert r.returncode == 0 and r.stdout == f"no runs under {results}\n", r.stdout + r.stderr
    # The local launcher for the tiny recipe; Slurm's for the wide one (on one host its ports clash).
    for recipe, launcher in zip(RECIPES, ("local", "slurm"), strict=True):
        r = _cli(
            "submit",
            "-r",
            recipe,
            "--dry-run",
            "--skip-flag-check",
            "--launcher",
            launcher,
            "--results-dir",
            str(results),
        )
        assert r.returncode == 0, r.stderr
    runs = RunDir.all_runs(results)
    assert [r.recipe for r in runs] == list(reversed(RECIPES))  # newest first

    # Not a terminal: every name whole; one line per run under a header.
    r = _cli("status", "--results-dir", str(results))
    assert r.returncode == 0, r.stderr
    header, *lines = r.stdout.splitlines()
    assert header.split() == ["ID", "RECIPE", "LAUNCHER", "STATE", "CREATED", "TIME", "POINTS"]
    assert [ln.split()[:2] for ln in lines] == [[run.short_id, run.recipe] for run in runs]
    assert all(ln.split()[2:5] == ["-", "not", "submitted"] for ln in lines), lines  # no launcher: never launched
    assert lines[1].endswith("0/2") and len(header) == len(lines[0]), r.stdout

    r = _cli("status", "--results-dir", str(results), "--limit", "1")
    assert r.stdout.splitlines()[-1] == "(1 newest of 2 runs; --limit 0 for all)", r.stdout

    r = _cli("status", "--json", "--results-dir", str(results))
    rows = json.loads(r.stdout)
    assert [(x["recipe"], x["short_id"], x["state"], x["reason"]) for x in rows] == [
        (run.recipe, run.short_id, "not submitted", "a dry run (--dry-run)") for run in runs
    ]
    assert rows[1]["points_valid"] == 0 and rows[1]["points_total"] == 2 and rows[1]["launcher"] is None
    r = _cli("status", runs[1].short_id, "--json", "--results-dir", str(results))
    assert json.loads(r.stdout) == rows[1]

    r = _cli("logs", runs[1].short_id, "--results-dir", str(results))
    assert r.returncode == 1, r.stdout
    assert r.stderr == f"error: {runs[1].path}: never submitted (a dry run (--dry-run)): it has no logs\n"


def test_status_fits_a_narrow_terminal(tmp_path: Path) -> None:
    """In a 72-column terminal the long recipe name gives way (cut, marked ~); the ids stay whole."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    results = tmp_path / "results"
    r = _cli("submit", "-r", RECIPES[1], "--dry-run", "--skip-flag-check", "--results-dir", str(results))
    assert r.returncode == 0, r.stderr
    (run,) = RunDir.all_runs(results)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 72, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "status", "--results-dir", str(results)],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=ROOT,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    out = b""
    while True:  # until the child closes the terminal (EOF, or EIO on Linux)
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(60) == 0, out
    os.close(leader)
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert len(lines) == 2 and all(len(ln) <= 72 for ln in lines), lines
    assert lines[1].startswith(f"{run.short_id}  dsr1-fp8-h2~  -  ") and len(lines[1]) == 72, lines
