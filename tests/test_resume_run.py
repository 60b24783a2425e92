"""`pdbench submit --resume RUN`: the new run keeps RUN's finished points and only they."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bench_results import bench_result

from harness.rundir import ResultName

pytestmark = pytest.mark.timeout(180)
RECIPE = "dsr1-fp8-mi355x-moriio-1p2d"  # renders without a model or vLLM here (--skip-flag-check)


def _submit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "harness", "submit", "--recipe", RECIPE, "--dry-run", "--skip-flag-check"]
    return subprocess.run([*argv, "--results-dir", str(tmp_path), *args], capture_output=True, text=True, timeout=120)


def _write(run: Path, concurrency: int, **kw) -> Path:
    n = 10 * concurrency  # the recipe's prompts_multiplier default
    r = bench_result(
        **({"max_concurrency": concurrency, "num_prompts": n, "completed": n, "random_input_len": 1024} | kw)
    )
    path = run / ResultName(concurrency, float("inf"), prefill_gpus=8, decode_gpus=16).filename
    path.write_text(r.model_dump_json())
    return path


def test_resume_copies_finished_points_and_turns_resume_on(tmp_path: Path) -> None:
    sets = ["--set", "benchmark.concurrency=[1,2,4]", "--set", "benchmark.osl=1024"]
    assert _submit(tmp_path, *sets).returncode == 0
    (old,) = (tmp_path / RECIPE).iterdir()
    done = _write(old, 1, random_output_len=1024)
    (old / "metrics" / "concurrency_1").mkdir(parents=True)
    (old / "metrics" / "concurrency_1" / "prefill-0.before.prom").write_text("x 1\n")
    _write(old, 2, random_output_len=1024, stop_reason="total timeout")  # cut short
    _write(old, 4, random_output_len=1024, failed=1, completed=39)  # a request failed

    # The time limit may change on a resume; what is measured may not.
    r = _submit(tmp_path, *sets, "--time", "04:00:00", "--resume", str(old))
    assert r.returncode == 0, r.stderr
    assert "1 finished point(s) kept" in r.stdout
    (new,) = (p for p in (tmp_path / RECIPE).iterdir() if p != old)
    assert sorted(p.name for p in new.glob("concurrency_*.json")) == [done.name]
    assert (new / done.name).read_bytes() == done.read_bytes()
    assert (new / "metrics" / "concurrency_1" / "prefill-0.before.prom").is_file()
    bench = json.loads((new / "bench.json").read_text())
    assert bench["resume"] is True and bench["metadata"]["resumed_from"] == str(old)
    assert "resumed_from" in (new / "recipe.lock.yaml").read_text()
    # An aggregated baseline's point keeps its evidence from metrics/aggregated/ too.
    agg = old / ResultName(8, float("inf"), gpus=24).filename
    agg.write_text(
        bench_result(max_concurrency=8, num_prompts=80, completed=80, random_input_len=1024, random_output_len=1024)
        .model_copy(update={"metadata": {"disagg": False}})
        .model_dump_json()
    )
    (old / "metrics" / "aggregated" / "concurrency_8").mkdir(parents=True)
    (old / "metrics" / "aggregated" / "concurrency_8" / "aggregated-0.after.prom").write_text("x 1\n")
    r = _submit(tmp_path, *sets, "--resume", str(old))
    assert r.returncode == 0 and "2 finished point(s) kept" in r.stdout, r.stderr
    (third,) = (p for p in (tmp_path / RECIPE).iterdir() if p not in (old, new))
    assert (third / "metrics" / "aggregated" / "concurrency_8" / "aggregated-0.after.prom").is_file()
    agg.unlink()
    # The old run is left as it was.
    assert len(list(old.glob("concurrency_*.json"))) == 3


def test_resume_takes_other_ports(tmp_path: Path) -> None:
    # The old run's ports may be taken (another job runs there now): where the processes
    # listen is not what they measure.
    assert _submit(tmp_path, "--set", "benchmark.concurrency=[1,2]").returncode == 0
    (old,) = (tmp_path / RECIPE).iterdir()
    done = _write(old, 1, random_output_len=1024)
    ports = ["topology.prefill.port=9100", "topology.decode.port=9300", "proxy.port=31000"]
    ports += ["connector.side_channel_port=5700"]
    sets = [a for s in ["benchmark.concurrency=[1,2]", *ports] for a in ("--set", s)]
    r = _submit(tmp_path, *sets, "--resume", str(old))
    assert r.returncode == 0, r.stderr
    assert "1 finished point(s) kept" in r.stdout, r.stdout
    (new,) = (p for p in (tmp_path / RECIPE).iterdir() if p != old)
    assert (new / done.name).read_bytes() == done.read_bytes()
    assert "--port 9100" in (new / "server.sh").read_text()  # the new ports are the ones used


def test_resume_refuses_a_run_that_measured_something_else(tmp_path: Path) -> None:
    assert _submit(tmp_path).returncode == 0
    (old,) = (tmp_path / RECIPE).iterdir()
    r = _submit(tmp_path, "--set", "benchmark.seed=7", "--set", "proxy.policy=least_outstanding", "--resume", str(old))
    assert r.returncode == 2
    assert "recipe.lock.yaml: recipe.benchmark.seed" in r.stderr
    assert (
        "changed: recipe.benchmark.seed: 0 then, 7 now; recipe.proxy.policy: 'round_robin' then, 'least_outstanding' now"
        in r.stderr
    )
    assert len(list((tmp_path / RECIPE).iterdir())) == 1  # no new run directory
    r = _submit(tmp_path, "--resume", str(tmp_path / "nope"))
    assert r.returncode == 2 and "nope" in r.stderr
