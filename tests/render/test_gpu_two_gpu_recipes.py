"""The two-GPU 1P1D recipes (for the device kind nvidia-h200-x2) colocate both roles on one node,
and pdbench places them: prefill on GPU 0, decode on GPU 1, each server still seeing the other
GPU: vLLM takes device 0 of CUDA_VISIBLE_DEVICES, and the bundled connector opens prefill's
blocks on decode's GPU as a peer only if decode can see prefill's GPU (connector/ipc.py finds it
by UUID). No recipe sets CUDA_VISIBLE_DEVICES itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _render(recipe: str, out: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "render", recipe, "--out", str(out), "--skip-flag-check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return (out / "server.sh").read_text()


def _visible(script: str, proc: str) -> str:
    body = re.search(rf"^proc_{proc}\(\) {{\n(.*?)^}}", script, re.M | re.S)
    assert body is not None, f"no proc_{proc} in server.sh"
    found = re.findall(r"^\s*export CUDA_VISIBLE_DEVICES=(\S+)$", body.group(1), re.M)
    assert len(found) == 1, body.group(1)
    return found[0]


@pytest.mark.parametrize("connector", ["pdbench", "nixl"])
def test_prefill_on_gpu_0_and_decode_on_gpu_1_each_seeing_both(tmp_path: Path, connector: str) -> None:
    recipe = f"llama8b-shape-bf16-h200x2-{connector}-1p1d"
    assert "CUDA_VISIBLE_DEVICES" not in (ROOT / "recipes" / f"{recipe}.yaml").read_text()
    script = _render(recipe, tmp_path)
    assert _visible(script, "prefill_0") == "0,1"
    assert _visible(script, "decode_0") == "1,0"
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["num_nodes"] == 1 and {p["node"] for p in plan["processes"]} == {0}, plan["processes"]
    lock = yaml.safe_load((tmp_path / "recipe.lock.yaml").read_text())
    assert lock["recipe"]["topology"]["gpus_per_node"] == 2
    assert lock["recipe"]["connector"]["name"] == connector
    # Same model and prompts as the one-GPU recipe, whose single instance is the reference.
    one = yaml.safe_load((ROOT / "recipes" / f"llama8b-shape-bf16-h200x1-{connector}-1p1d.yaml").read_text())
    two = yaml.safe_load((ROOT / "recipes" / f"{recipe}.yaml").read_text())
    assert two["model"] == one["model"] and two["benchmark"] == one["benchmark"]
    single = yaml.safe_load((ROOT / "recipes" / "llama8b-shape-bf16-h200x1-none-agg.yaml").read_text())
    assert single["model"] == one["model"] and single["benchmark"] == one["benchmark"]


def test_nixl_recipe_runs_two_replicas_on_the_same_gpus_after_1p1d(tmp_path: Path) -> None:
    script = _render("llama8b-shape-bf16-h200x2-nixl-1p1d", tmp_path)
    # the baseline: one whole instance a GPU, each its own only, no connector
    assert _visible(script, "aggregated_0") == "0" and _visible(script, "aggregated_1") == "1"
    agg = script.split("proc_aggregated_0() {", 1)[1].split("\n}\n", 1)[0]
    assert "--kv-transfer-config" not in agg and "gpu-memory-utilization 0.85" in agg
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["num_nodes"] == 1


def test_the_single_instance_reference_is_one_gpu_of_one_node(tmp_path: Path) -> None:
    script = _render("llama8b-shape-bf16-h200x1-none-agg", tmp_path)
    assert re.findall(r"^proc_(\w+)\(\)", script, re.M) == ["aggregated_0", "proxy_aggregated", "bench_aggregated"]
    assert _visible(script, "aggregated_0") == "0"
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["num_nodes"] == 1
