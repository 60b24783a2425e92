"""The outcome `pdbench submit --wait` prints when another client than pdbench's measured the
sweep: that client's point directories, not pdbench's missing result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.invocation import prog
from harness.rundir import RunDir
from harness.rundir.paths import client_point_subdir
from harness.submit.follow import summary


def _run(tmp_path: Path, client: str) -> RunDir:
    path = tmp_path / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261126T020000Z-abc123"
    path.mkdir(parents=True)
    run = RunDir(path)
    cfg = {"client": client, "concurrency": [2, 4], "isl": 256, "osl": 32}
    cfg |= {"base_url": "http://127.0.0.1:30000", "model": "tiny", "result_dir": "."}
    run.bench_config().write_text(json.dumps(cfg))
    return run


def test_an_aiperf_sweep_names_its_point_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, "aiperf")
    (run.path / client_point_subdir("aiperf", 2)).mkdir(parents=True)
    summary(run, 0)
    out = capsys.readouterr().out
    assert (
        f"succeeded: aiperf measured the sweep, 1 of 2 point(s) written, under {run.path}/clients/aiperf/conc_<C>/"
        in out
    )
    assert "no result" not in out and "valid" not in out, out
    assert f"next: {prog()} report tiny-fp32-cpu-nixl-1p1d/abc123" in out, out  # prog(): tests/cli/test_cli_hints.py


def test_a_pdbench_sweep_keeps_its_point_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, "pdbench")
    summary(run, 1)
    out = capsys.readouterr().out
    assert "measured the sweep" not in out and "FAILED (exit 1)" in out, out
