"""Two servers of different roles on one GPU (the one-H200 1P1D: prefill and decode share GPU 0,
and the local launcher's two nodes each sample it): the whole counts the GPU once, in energy and
in GPU-time, and the record names the GPU the roles share.

tests/data/power_h200x1_shared is a real run's (one H200, vLLM 0.20.0, the 8B-Llama shape,
llama8b-shape-bf16-h200x1-pdbench-1p1d, 2026-11-29): its plan, lock, both nodes' NVML samples
and one point (ISL 4096, OSL 64, C=8). Node 0's accounting on the machine counted GPU 0 twice
(total 2 GPUs, twice its energy); this test recomputes it from the samples."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from harness.power.account import account
from harness.rundir import RunDir
from harness.topology import PlanFile

DATA = Path(__file__).resolve().parents[1] / "data" / "power_h200x1_shared"
RESULT = "concurrency_8_req_rate_inf_isl_4096_osl_64_gpus_2_ctx_1_gen_1.json"


def _uuids(csv_path: Path) -> set[str]:
    with csv_path.open() as f:
        return {row["gpu_uuid"] for row in csv.DictReader(f)}


def _energy_counter_j(csv_path: Path, start: float, end: float) -> float:
    """The GPU's own energy counter over [start, end], from the samples nearest inside it: an
    independent check of the integrated power (NVML's counter, not pdbench's trapezoid)."""
    with csv_path.open() as f:
        rows = [(float(r["timestamp_unix"]), float(r["energy_j"])) for r in csv.DictReader(f)]
    inside = [r for r in rows if start <= r[0] <= end]
    (t0, e0), (t1, e1) = inside[0], inside[-1]
    return (e1 - e0) * (end - start) / (t1 - t0)


def test_one_gpu_of_two_roles_counts_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(DATA, run_dir)
    run = RunDir(run_dir)
    # The premise: both nodes sampled the one GPU, and the plan gives it to prefill and decode.
    (uuid,) = _uuids(run.power_samples(0))
    assert _uuids(run.power_samples(1)) == {uuid}
    plan = PlanFile.model_validate_json(run.plan.read_text())
    assert {w.role for w in plan.workers if w.phase == "disagg"} == {"prefill", "decode"}
    lock = yaml.safe_load(run.lock.read_text())
    lock["recipe"]["site"] = {"gpu_hour_usd": 3.6}
    run.lock.write_text(yaml.safe_dump(lock))

    [p] = account(run_dir, plan, "disagg", [run_dir / RESULT], 0.0)
    assert p.power_valid is True, p.reasons
    assert p.total is not None and p.total.gpus == 1
    prefill, decode = p.roles["prefill"], p.roles["decode"]
    # Each role's energy is its GPU's whole: the same GPU, so the same joules as the total.
    assert prefill.energy_j == pytest.approx(p.total.energy_j, rel=0.02)
    assert decode.energy_j == pytest.approx(p.total.energy_j, rel=0.02)
    assert list(p.shared_gpus.values()) == [["prefill-0", "decode-0"]]
    # One H200 busy at C=8 draws 100-700 W: the total's mean is one GPU's, not two.
    assert 100 < p.total.mean_w < 700, p.total
    assert p.duration_s is not None
    counter = _energy_counter_j(run.power_samples(0), p.start_unix, p.end_unix)  # type: ignore[arg-type]
    assert p.total.energy_j == pytest.approx(counter, rel=0.1)
    # GPU-time: one GPU for the window.
    assert p.cost is not None and p.cost.gpus == 1
    assert p.cost.gpu_time_usd == pytest.approx(3.6 * p.duration_s / 3600, rel=1e-6)
    written = json.loads(run.power_point(RESULT).read_text())
    assert written["total"]["gpus"] == 1 and written["shared_gpus"]
