"""Cluster profiles: search order, merge precedence (recipe < profile < --set), provenance in
recipe.lock.yaml, errors naming the profile, and what a site's settings render into."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config import load_recipe
from harness.config.cluster import chosen_profile, profile_path
from harness.config.load import PROJECT_ROOT, ConfigError
from harness.node.coordination import discover_address, interface_address
from harness.render import RenderContext, render_job

CTX = RenderContext(run_dir="/shared/results/RUN", root="/opt/pdbench", python="/usr/bin/python3", git_commit=None)


def _render(tmp_path: Path, recipe: str, cluster: str | None, overrides: list[str] | None = None) -> Path:
    rr = load_recipe(recipe, overrides or [], cluster=cluster)
    tmp_path.mkdir(parents=True, exist_ok=True)
    render_job(rr, tmp_path, CTX)
    return tmp_path


def test_local_profile_supplies_every_cluster_setting_of_local_tiny_1p2d() -> None:
    text = (PROJECT_ROOT / "recipes" / "tiny-fp32-cpu-nixl-1p2d.yaml").read_text()
    data = yaml.safe_load(text)
    # The recipe is portable: nothing of the machine is left in it.
    assert "container" not in data and "slurm" in data and set(data["slurm"]) == {"time_limit"}
    assert set(data["topology"]) == {"prefill", "decode"}
    assert all("cpu_bind" not in data["topology"][r] for r in ("prefill", "decode"))
    rr = load_recipe("tiny-fp32-cpu-nixl-1p2d", cluster="local")
    t = rr.recipe.topology
    assert (t.gpus_per_node, t.nic_detection, t.prefill.cpu_bind, t.decode.cpu_bind) == (0, False, ["0"], ["1"])
    assert rr.recipe.container.runtime == "none" and rr.recipe.slurm.gpu_request == "none"
    assert rr.cluster_file == PROJECT_ROOT / "clusters" / "local.yaml"


def test_precedence_and_provenance_in_the_lock_file(tmp_path: Path) -> None:
    out = _render(tmp_path, "tiny-fp32-cpu-nixl-1p2d", "local", ['topology.decode.cpu_bind=["0"]', "benchmark.isl=128"])
    lock = yaml.safe_load((out / "recipe.lock.yaml").read_text())
    src = lock["sources"]
    assert src["topology.prefill.cpu_bind"] == "clusters/local.yaml"  # profile over recipe
    assert src["topology.decode.cpu_bind"] == "--set"  # --set over profile
    assert src["benchmark.isl"] == "--set" and src["benchmark.osl"] == "recipes/tiny-fp32-cpu-nixl-1p2d.yaml"
    assert src["topology.prefill.tp"] == "default"
    assert lock["recipe"]["topology"]["decode"]["cpu_bind"] == ["0"]
    assert lock["cluster_profile"].endswith("clusters/local.yaml")
    # The profile's values are part of what the fingerprint covers.
    other = load_recipe("tiny-fp32-cpu-nixl-1p2d", ['topology.decode.cpu_bind=["0"]', "benchmark.isl=128"])
    assert lock["fingerprint"] != other.fingerprint


def test_profile_overrides_the_recipe_and_picks_the_image_by_model(tmp_path: Path) -> None:
    rr = load_recipe("dsr1-fp8-mi355x-moriio-1p2d", cluster="example-mi355x-mori")
    assert rr.recipe.container.image == "registry.example.internal/vllm/vllm-openai-rocm:v0.32.0"
    assert rr.recipe.slurm.partition == "mi355x" and rr.recipe.topology.prefill.tp == 8  # recipe kept
    assert rr.provenance["container.image"] == "clusters/example-mi355x-mori.yaml"
    assert rr.provenance["container.runtime"] == "clusters/example-mi355x-mori.yaml"


def test_errors_name_the_profile_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "site.yaml"
    bad.write_text("slurm:\n  gpu_request: gpus\n")
    with pytest.raises(ConfigError) as e:
        load_recipe("tiny-fp32-cpu-nixl-1p2d", cluster=str(bad))
    assert e.value.file == str(bad) and e.value.key == "slurm.gpu_request"
    bad.write_text("partition: x\n")  # not a profile key
    with pytest.raises(ConfigError) as e:
        load_recipe("tiny-fp32-cpu-nixl-1p2d", cluster=str(bad))
    assert e.value.file == str(bad) and e.value.key == "partition" and "unknown key" in str(e.value)
    bad.write_text("site:\n  model_root: relative/models\n")
    with pytest.raises(ConfigError, match=r"site\.model_root: .relative/models. is not an absolute path") as e:
        load_recipe("dsr1-fp8-mi355x-moriio-1p2d", cluster=str(bad))
    assert e.value.file == str(bad)
    with pytest.raises(ConfigError, match=r"--set container\.runtime: Input should be"):
        load_recipe("tiny-fp32-cpu-nixl-1p2d", ["container.runtime=lxc"], cluster="local")


def test_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PDBENCH_CLUSTERS_DIR", raising=False)
    assert profile_path("local", PROJECT_ROOT) == PROJECT_ROOT / "clusters" / "local.yaml"
    user = tmp_path / "home" / ".config" / "pdbench" / "clusters"
    user.mkdir(parents=True)
    (user / "local.yaml").write_text("description: mine\n")
    assert profile_path("local", PROJECT_ROOT) == user / "local.yaml"
    site = tmp_path / "site"
    site.mkdir()
    (site / "local.yaml").write_text("description: the site's\n")
    monkeypatch.setenv("PDBENCH_CLUSTERS_DIR", str(site))
    assert profile_path("local", PROJECT_ROOT) == site / "local.yaml"
    assert profile_path(str(tmp_path / "x.yaml"), PROJECT_ROOT) == tmp_path / "x.yaml"
    with pytest.raises(FileNotFoundError, match="shipped: example-h200-nixl, example-mi355x-mori, local"):
        profile_path("nosuch", PROJECT_ROOT)
    # --cluster wins over $PDBENCH_CLUSTER; an empty value means none.
    monkeypatch.setenv("PDBENCH_CLUSTER", "local")
    assert chosen_profile(None) == "local" and chosen_profile("other") == "other" and chosen_profile("") is None


def test_cli_takes_the_profile_from_the_environment(tmp_path: Path) -> None:
    env = dict(os.environ, PDBENCH_CLUSTER="local")
    r = subprocess.run(
        [sys.executable, "-m", "harness", "validate", "tiny-fp32-cpu-nixl-1p2d", "--skip-flag-check"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=PROJECT_ROOT,
    )
    assert r.returncode == 0, r.stderr
    env["PDBENCH_CLUSTER"] = "nosuch"
    r = subprocess.run(
        [sys.executable, "-m", "harness", "validate", "tiny-fp32-cpu-nixl-1p2d", "--skip-flag-check"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=PROJECT_ROOT,
    )
    assert r.returncode == 2 and "cluster profile 'nosuch' not found" in r.stderr


def test_site_storage_renders_read_only_mounts_and_offline_mode(tmp_path: Path) -> None:
    out = _render(tmp_path / "amd", "dsr1-fp8-mi355x-moriio-1p2d", "example-mi355x-mori")
    server, wrapper, job = ((out / f).read_text() for f in ("server.sh", "container.sh", "job.slurm"))
    assert server.count("exec vllm serve /shared/models/deepseek-ai/DeepSeek-R1-0528") == 3
    assert "export HF_HUB_OFFLINE=1\n" in server and "export HF_HUB_CACHE=/shared/hf-cache\n" in server
    assert "-v /shared/models:/shared/models:ro" in wrapper and "-v /shared/hf-cache:/shared/hf-cache:ro" in wrapper
    assert "#SBATCH --gres=gpu:8\n" in job and "--gpus-per-node" not in job
    out = _render(tmp_path / "nv", "dsr1-fp8-h200-nixl-1p2d", "example-h200-nixl")
    server, wrapper, job = ((out / f).read_text() for f in ("server.sh", "container.sh", "job.slurm"))
    # An HF id served from the shared cache, offline (1P2D, then its 3 aggregated servers).
    assert server.count("exec vllm serve deepseek-ai/DeepSeek-R1-0528") == 6
    assert "export HF_HUB_OFFLINE=1\n" in server and "export HF_HUB_CACHE=/lustre/shared/hf-cache\n" in server
    assert "-v /lustre/shared/hf-cache:/lustre/shared/hf-cache:ro" in wrapper and "#SBATCH --gpus-per-node=8" in job
    # No site storage: the hub (nothing claims to be offline).
    out = _render(tmp_path / "hub", "dsr1-fp8-mi355x-moriio-1p2d", None)
    assert "HF_HUB_OFFLINE" not in (out / "server.sh").read_text()


def test_site_install_location_is_where_the_job_runs_pdbench(tmp_path: Path) -> None:
    from harness.render import current_context

    rr = load_recipe("dsr1-fp8-mi355x-moriio-1p2d", cluster="example-mi355x-mori")
    ctx = current_context(tmp_path, PROJECT_ROOT, rr)
    assert ctx.root == "/shared/tools/pdbench" and ctx.python == "/shared/tools/pdbench/.venv/bin/python"
    render_job(rr, tmp_path, ctx)
    assert "PDBENCH_ROOT=/shared/tools/pdbench\n" in (tmp_path / "job.slurm").read_text()


def test_node_address_from_the_named_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PDBENCH_NODE_ADDR", raising=False)
    assert interface_address("lo") == "127.0.0.1"
    assert discover_address("lo") == "127.0.0.1"
    with pytest.raises(OSError, match="network interface 'nosuch0' has no IPv4 address"):
        discover_address("nosuch0")
    monkeypatch.setenv("PDBENCH_NODE_ADDR", "10.1.2.3")  # an explicit address still wins
    assert discover_address("lo") == "10.1.2.3"


def test_a_failing_nic_detection_fails_the_server(tmp_path: Path) -> None:
    """`eval "$(pdbench nic ...)"` under set -e went on with UCX/NCCL defaults; now it stops."""
    out = _render(tmp_path / "job", "dsr1-fp8-mi355x-nixl-1p2d", None)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "vllm-started"
    (bin_dir / "vllm").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (bin_dir / "vllm").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PDBENCH_PYTHON="false", PDBENCH_NODE_ADDR="10.0.0.1")
    r = subprocess.run(["bash", str(out / "server.sh"), "proc", "prefill-0"], env=env, timeout=30, capture_output=True)
    assert r.returncode != 0 and not marker.exists()
    env["PDBENCH_PYTHON"] = "true"  # detection succeeds (prints nothing): the server starts
    r = subprocess.run(["bash", str(out / "server.sh"), "proc", "prefill-0"], env=env, timeout=30, capture_output=True)
    assert r.returncode == 0 and marker.exists()


def _submit_dry_run(tmp_path: Path, *sets: str) -> subprocess.CompletedProcess:
    args = [
        sys.executable,
        "-m",
        "harness",
        "submit",
        "--recipe",
        "dsr1-fp8-mi355x-moriio-1p2d",
        "--dry-run",
        "--skip-flag-check",
    ]
    args += ["--results-dir", str(tmp_path / "results")]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT)


def test_submit_refuses_weights_or_install_it_can_see_are_missing(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "deepseek-ai" / "DeepSeek-R1-0528").mkdir(parents=True)
    r = _submit_dry_run(tmp_path, f"site.model_root={root}")
    assert r.returncode == 2, r.stdout
    assert f"submit host: {root}/deepseek-ai/DeepSeek-R1-0528" in r.stderr and "config.json" in r.stderr, r.stderr
    assert not (tmp_path / "results").exists()  # nothing queued, no run directory
    (root / "deepseek-ai" / "DeepSeek-R1-0528" / "config.json").write_text("{}")
    (root / "deepseek-ai" / "DeepSeek-R1-0528" / "model.safetensors").write_bytes(b"\0" * 64)
    r = _submit_dry_run(tmp_path, f"site.model_root={root}")
    assert r.returncode == 0, r.stderr
    # A model root this host does not see is left to every node's preflight.
    assert _submit_dry_run(tmp_path, "site.model_root=/not/mounted/here").returncode == 0
    r = _submit_dry_run(tmp_path, f"site.pdbench_root={tmp_path / 'nopdbench'}")
    assert r.returncode == 2 and "site.pdbench_root" in r.stderr and "holds no pdbench checkout" in r.stderr, r.stderr


def test_a_node_where_pdbench_cannot_run_records_why(tmp_path: Path) -> None:
    """A checkout that is not on the nodes' storage: the node says so as the job's cause,
    instead of a bare 'No such file' in Slurm's output and no status at all."""
    out = _render(tmp_path / "job", "tiny-fp32-cpu-nixl-1p1d", None)
    env = dict(os.environ, SLURM_NODEID="1", RUN_DIR=str(out), PDBENCH_PYTHON="/not/shared/.venv/bin/python")
    r = subprocess.run(["bash", str(out / "server.sh")], env=env, timeout=30, capture_output=True, text=True)
    assert r.returncode == 1
    from harness.rundir import RunDir, read_status

    status = read_status(RunDir(out))
    assert status is not None and status["state"] == "failed"
    assert (
        status["reason"].startswith("node 1: pdbench cannot run on ")
        and "/not/shared/.venv/bin/python" in status["reason"]
    )
    assert "site.pdbench_root" in status["reason"]
