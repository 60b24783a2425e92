"""The power package (power/<phase>/) against InferenceX's own validator.

InferenceX's utils/aggregate_power_multinode.py (SemiAnalysisAI/InferenceX at 843c6254)
re-validates srt-slurm's dcgm-power v1 package and patches role energy into its aggregate.
These tests take that script and the utils/aggregate_power.py it imports from an InferenceX
git directory (PDBENCH_INFERENCEX_GIT, else the mirror at MIRROR) into the test's temporary
directory (nothing of it is committed) and run it on what node 0's accounting wrote for a
1P1D point on two GPUs of one node (the x2 recipe's plan), so the package is judged by its
reader's code, not by a copy of its rules. Without the git directory they skip, saying so.

As it is, InferenceX refuses the package for what pdbench says about itself and nothing else:
the producer (pdbench.power, not srt-slurm.dcgm-power; its commit pin passes when given
pdbench's commit instead of srt-slurm's), the source metric and scope (NVML's reading, not DCGM's), the absent DCGM exporter. With those
four of its checks given pdbench's values, everything else passes and its role energies are
pdbench's own. Its single-node utils/aggregate_power.py reads the node's raw samples as they are.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from harness.config import load_recipe
from harness.power.account import account
from harness.power.package import PRODUCER, SCOPES
from harness.render import RenderContext, render_job
from harness.rundir import RunDir
from harness.rundir.power_samples import Sample, SamplerRecord, append, write_record
from harness.topology import PlanFile

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "843c6254ff69b567f772f6a5fd97675af3d04431"
# A fetched mirror beside the checkout (the tool library's layout), else PDBENCH_INFERENCEX_GIT.
MIRROR = ROOT.parent / ".mirror" / "SemiAnalysisAI+InferenceX" / "repo"
SCRIPTS = ("utils/aggregate_power.py", "utils/aggregate_power_multinode.py")
PDBENCH_COMMIT = "0123456789abcdef0123456789abcdef01234567"
RESULT = "concurrency_8_req_rate_inf_gpus_2_ctx_1_gen_1.json"
START, END = 1_800_000_010.125, 1_800_000_040.375


_SINGLE: list[ModuleType] = []  # aggregate_power, as the multinode script imported it


def _inferencex(tmp: Path) -> ModuleType:
    git_dir = Path(os.environ.get("PDBENCH_INFERENCEX_GIT") or MIRROR)
    if not git_dir.exists():
        pytest.skip(f"no InferenceX git directory at {git_dir} (set PDBENCH_INFERENCEX_GIT to one)")
    out = tmp / "inferencex"
    out.mkdir()
    for path in SCRIPTS:
        shown = subprocess.run(
            ["git", "--git-dir" if (git_dir / "HEAD").is_file() else "-C", str(git_dir), "show", f"{COMMIT}:{path}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if shown.returncode != 0:
            pytest.skip(f"{git_dir} has no {path} at {COMMIT}: {shown.stderr.strip()}")
        (out / Path(path).name).write_text(shown.stdout)
    sys.path.insert(0, str(out))
    try:
        for name in ("aggregate_power", "aggregate_power_multinode"):
            sys.modules.pop(name, None)
        multinode = importlib.import_module("aggregate_power_multinode")
        _SINGLE.append(sys.modules["aggregate_power"])
        return multinode
    finally:
        sys.path.remove(str(out))


@pytest.fixture
def point(tmp_path: Path) -> tuple[RunDir, Path]:
    """A rendered x2 1P1D run (prefill GPU 0, decode GPU 1 of one node) with one point, its
    node's samples and node 0's accounting done."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    rr = load_recipe("llama8b-shape-bf16-h200x2-nixl-1p1d", ["site.gpu_hour_usd=3.0", "site.kwh_usd=0.2"])
    render_job(rr, run.path, RenderContext(str(run.path), str(ROOT), sys.executable, PDBENCH_COMMIT))
    result = {
        "max_concurrency": 8,
        "model_id": "llama-8b-shape",
        "benchmark_start_time_unix": START,
        "benchmark_end_time_unix": END,
        "duration": END - START,
        "completed": 64,
        "total_input_tokens": 64 * 1024,
        "total_output_tokens": 64 * 256,
    }
    (run.path / RESULT).write_text(json.dumps(result, indent=2))
    rec = SamplerRecord(
        status="sampling",
        backend="nvml",
        source_metric="nvmlDeviceGetPowerUsage",
        hostname="h200-host",
        node=0,
        interval_s=0.25,
        started_at_unix=START - 60,
        gpus=["0:GPU-p", "1:GPU-d"],
    )
    write_record(run.power_record(0), rec)
    t = START - 5.0
    while t < END + 2.0:  # prefill ramps 300 -> 600 W; decode holds 450 W
        append(
            run.power_samples(0),
            [
                Sample(t, "h200-host", 0, "GPU-p", 300.0 + 10.0 * (t - START) if t > START else 300.0),
                Sample(t + 0.001, "h200-host", 1, "GPU-d", 450.0),
            ],
        )
        t += 0.25
    plan = PlanFile.model_validate_json(run.plan.read_text())
    [p] = account(run.path, plan, "disagg", [run.path / RESULT], START - 60)
    assert p.power_valid is True, p.reasons
    return run, run.path / RESULT


def _aggregate(ix: ModuleType, run: RunDir, result: Path, tmp: Path) -> tuple[int, dict, dict]:
    agg = tmp / "agg.json"
    agg.write_text(json.dumps({"hw": "h200"}))
    sidecar = tmp / "power_validation.json"
    rc = ix.run(
        run.power_package("disagg"),
        result,
        agg,
        prefill_gpus=1,
        decode_gpus=1,
        expected_producer_sha=PDBENCH_COMMIT,
        logs_root=run.path,
        validation_result=sidecar,
        require_power=True,
    )
    return rc, json.loads(agg.read_text()), json.loads(sidecar.read_text())


def test_inferencex_refuses_only_what_pdbench_says_of_itself(point, tmp_path: Path) -> None:
    ix = _inferencex(tmp_path)
    run, result = point
    rc, agg, sidecar = _aggregate(ix, run, result, tmp_path)
    assert rc == 1 and agg["power_valid"] == 0 and sidecar["power_valid"] is False
    assert sidecar["failures"] == [
        f"producer is {PRODUCER!r}, expected 'srt-slurm.dcgm-power'",
        "source_metric is 'nvml', expected 'DCGM_FI_DEV_POWER_USAGE'",
        f"power_scope is {SCOPES['nvml']!r}, expected 'gpu_device_board_as_reported_by_dcgm'",
        "dcgm_exporter is not an object",
        "stored publication_valid=True, recomputed=False",
    ], sidecar
    assert sidecar["reasons"] == ["package_recompute_invalid", "producer_verdict_mismatch"]
    # the producer pin itself passed (pdbench's commit was the expected one), and the devices'
    # roles were read as the plan has them
    assert sidecar["producer"]["producer_git_commit"] == PDBENCH_COMMIT
    assert sidecar["per_gpu_role"] == {"h200-host/GPU-p": "prefill", "h200-host/GPU-d": "decode"}


def test_inferencex_agrees_on_everything_else(point, tmp_path: Path, monkeypatch) -> None:
    ix = _inferencex(tmp_path)
    run, result = point
    monkeypatch.setattr(ix, "PRODUCER", PRODUCER)
    monkeypatch.setattr(ix, "POWER_METRIC", "nvml")
    monkeypatch.setattr(ix, "POWER_SCOPE", SCOPES["nvml"])
    wire = ix._check_wire_contract
    monkeypatch.setattr(
        ix, "_check_wire_contract", lambda m: [f for f in wire(m) if f != "dcgm_exporter is not an object"]
    )
    rc, agg, sidecar = _aggregate(ix, run, result, tmp_path)
    assert rc == 0 and sidecar["failures"] == [] and agg["power_valid"] == 1, sidecar
    ours = json.loads(run.power_point(RESULT).read_text())
    pre, dec, total = ours["roles"]["prefill"], ours["roles"]["decode"], ours["total"]
    assert agg["prefill_gpu_energy_j"] == round(pre["energy_j"], 3)
    assert agg["decode_gpu_energy_j"] == round(dec["energy_j"], 3)
    assert agg["prefill_avg_power_w"] == round(pre["mean_w"], 3)
    assert agg["decode_avg_power_w"] == round(dec["mean_w"], 3)
    assert agg["total_gpu_energy_j"] == round(total["energy_j"], 3)
    assert agg["prefill_joules_per_input_token"] == round(pre["j_per_input_token"], 6)
    assert agg["decode_joules_per_output_token"] == round(dec["j_per_output_token"], 6)
    assert agg["joules_per_successful_query"] == round(total["j_per_request"], 6)
    # and both are what the samples say: decode 450 W for the window; prefill's ramp from 300 W
    duration = END - START
    assert dec["energy_j"] == pytest.approx(450.0 * duration)
    assert pre["energy_j"] == pytest.approx(300.0 * duration + 10.0 * duration**2 / 2, rel=1e-6)
    assert ours["cost"]["gpu_time_usd"] == pytest.approx(3.0 * 2 * duration / 3600)


def test_inferencex_single_node_script_reads_the_raw_samples_as_they_are(point, tmp_path: Path) -> None:
    # utils/aggregate_power.py (single node, the aggregated baseline's path) reads an SMI-style CSV
    # by its column names: power/raw/node0.csv's timestamp_unix, gpu_index and power_w are found as
    # they are, with no producer check to refuse.
    _inferencex(tmp_path)
    single = _SINGLE[-1]
    run, result = point
    agg = tmp_path / "agg-single.json"
    agg.write_text(json.dumps({"hw": "h200"}))
    rc = single.run(run.power_samples(0), result, agg, expected_num_gpus=2, require_power=True)
    out = json.loads(agg.read_text())
    assert rc == 0 and out["power_valid"] == 1, out
    total = json.loads(run.power_point(RESULT).read_text())["total"]
    assert out["total_gpu_energy_j"] == round(total["energy_j"], 3)
    assert out["joules_per_successful_query"] == round(total["j_per_request"], 6)
