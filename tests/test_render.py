"""Rendered scripts: golden files, bash -n, shellcheck, and what the commands contain."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.config import load_recipe
from harness.render import RenderContext, render_job

GOLDEN = Path(__file__).parent / "golden"
RECIPES = ["local-tiny-1p1d", "dsr1-fp8-1p2d", "dsr1-fp8-1p2d-nixl"]
CTX = RenderContext(run_dir="/shared/results/RUN", root="/opt/pdbench",
                    python="/opt/pdbench/.venv/bin/python", git_commit="0123abcd")


def _render(recipe: str, out: Path, overrides: list[str] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    render_job(load_recipe(recipe, overrides or []), out, CTX)
    return out


def _shellcheck() -> str:
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.fail("shellcheck is not installed (scripts/setup.sh installs it)")
    return exe


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("script", ["job.slurm", "server.sh"])
def test_golden(recipe: str, script: str, tmp_path: Path) -> None:
    text = (_render(recipe, tmp_path) / script).read_text()
    golden = GOLDEN / recipe / script
    if os.environ.get("PDBENCH_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{script} of {recipe} differs from {golden}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_scripts_pass_bash_n_and_shellcheck(recipe: str, tmp_path: Path) -> None:
    out = _render(recipe, tmp_path)
    for script in ("job.slurm", "server.sh"):
        path = out / script
        r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([_shellcheck(), "-x", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("runtime", ["none", "docker", "podman", "enroot", "apptainer"])
def test_every_container_runtime_renders_clean_shell(runtime: str, tmp_path: Path) -> None:
    out = _render("dsr1-fp8-1p2d", tmp_path, [f"container.runtime={runtime}"])
    job = (out / "job.slurm").read_text()
    r = subprocess.run([_shellcheck(), str(out / "job.slurm")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    launch = {"none": 'bash "$RUN_DIR/server.sh"', "docker": "docker run --rm --init",
              "podman": "podman run --rm --init", "enroot": "--container-image=",
              "apptainer": "apptainer exec"}[runtime]
    assert launch in job


def test_dsr1_commands(tmp_path: Path) -> None:
    server = (_render("dsr1-fp8-1p2d", tmp_path) / "server.sh").read_text()
    assert server.count("exec vllm serve deepseek-ai/DeepSeek-R1-0528") == 3
    assert server.count("--enable-expert-parallel") == 2  # decode only
    assert '\\"kv_role\\":\\"kv_producer\\"' in server
    assert server.count('\\"kv_role\\":\\"kv_consumer\\"') == 2
    assert '\\"proxy_ip\\":\\"${PDBENCH_NODE_0_ADDR}\\"' in server
    assert "export VLLM_ALL2ALL_BACKEND=mori" in server
    job = (tmp_path / "job.slurm").read_text()
    assert "#SBATCH --nodes=3" in job and "#SBATCH --ntasks=3" in job
    assert "--kill-on-bad-exit=1" in job


def test_nixl_side_channel_ports_are_distinct_per_worker(tmp_path: Path) -> None:
    server = (_render("dsr1-fp8-1p2d-nixl", tmp_path) / "server.sh").read_text()
    ports = [line.split("=")[1] for line in server.splitlines() if "VLLM_NIXL_SIDE_CHANNEL_PORT=" in line]
    assert ports == ["5600", "5608", "5616"]  # 8 ranks each
    assert server.count('export VLLM_NIXL_SIDE_CHANNEL_HOST="${PDBENCH_NODE_ADDR}"') == 3
    assert '\\"kv_buffer_device\\":\\"cuda\\"' not in server  # plain JSON: no shell expansion needed
    assert "'{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\",\"kv_buffer_device\":\"cuda\"}'" in server


def test_lock_plan_and_bench_files(tmp_path: Path) -> None:
    out = _render("local-tiny-1p1d", tmp_path)
    rr = load_recipe("local-tiny-1p1d")
    lock = yaml.safe_load((out / "recipe.lock.yaml").read_text())
    assert lock["fingerprint"] == rr.fingerprint
    assert lock["git_commit"] == "0123abcd" and lock["pdbench_version"]
    assert lock["recipe"]["benchmark"]["isl"] == 256 and lock["model"]["name"] == "tiny-llama"
    plan = json.loads((out / "plan.json").read_text())
    assert [(w["name"], w["node"], w["port"]) for w in plan["workers"]] == [("prefill-0", 0, 8100), ("decode-0", 1, 8200)]
    bench = json.loads((out / "bench.json").read_text())
    assert bench["base_url"] == "http://127.0.0.1:30000"
    assert (bench["prefill_gpus"], bench["decode_gpus"]) == (1, 1)
    assert bench["metadata"]["recipe_fingerprint"] == rr.fingerprint


def test_render_never_overwrites(tmp_path: Path) -> None:
    _render("local-tiny-1p1d", tmp_path)
    before = (tmp_path / "server.sh").read_text()
    with pytest.raises(FileExistsError):
        _render("local-tiny-1p1d", tmp_path, ["benchmark.isl=512"])
    assert (tmp_path / "server.sh").read_text() == before


def test_override_changes_fingerprint_and_command(tmp_path: Path) -> None:
    a = load_recipe("local-tiny-1p1d")
    b = load_recipe("local-tiny-1p1d", ["topology.decode.flags.max-num-seqs=8"])
    assert a.fingerprint != b.fingerprint
    server = (_render("local-tiny-1p1d", tmp_path, ["topology.decode.flags.max-num-seqs=8"]) / "server.sh").read_text()
    decode = server.split("proc_decode_0()")[1].split("\n}\n")[0]
    assert "--max-num-seqs 8" in decode
