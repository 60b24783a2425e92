"""`pdbench report` of a `pdbench bench --result-dir` folder reads its points and passes over
pdbench's own records beside them: the sentinel answers are not listed as skipped files."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.bench_configs import sentinel_config
from helpers.bench_fake_server import FakeServer
from helpers.cli_run import pdbench

from harness import tiny_model
from harness.bench.sweep import run_sweep_detailed

pytestmark = pytest.mark.timeout(120)


def test_report_of_a_bench_folder_skips_no_sentinel_record(tmp_path: Path) -> None:
    model = str(tiny_model.build(tmp_path / "model"))
    out = tmp_path / "out"
    with FakeServer(token_delay=0.001) as reference, FakeServer(token_delay=0.001) as target:
        (point,) = run_sweep_detailed(sentinel_config(model, out, target.base_url, reference.base_url))
    assert point.path is not None, point.error  # the bench wrote its point
    # Precondition: the bench wrote its sentinel records beside the point, named like it.
    records = sorted(p.relative_to(out).as_posix() for p in (out / "sentinels").glob("*.json"))
    assert records == ["sentinels/concurrency_2.json", "sentinels/reference.json"], records

    r = pdbench("report", str(out), "--format", "md")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Skipped files" not in r.stdout and "sentinels" not in r.stdout + r.stderr, r.stdout
    assert "## Results" in r.stdout and "| `out` | 32 | 8 | 2 | 20 |" in r.stdout, r.stdout
    assert point.path.parent == out
