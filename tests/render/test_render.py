"""Rendered scripts: golden files, bash -n, shellcheck, and what the commands contain."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.render_cases import VARIANTS, render_case, render_recipe, variant

from harness.config import load_recipe
from harness.config.load import ConfigError
from harness.render import RenderContext, render_job

GOLDEN = Path(__file__).parents[1] / "golden"


def _shellcheck() -> str:
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.fail("shellcheck is not installed (scripts/setup.sh installs it)")
    return exe


# The container runtime and Slurm options change only job.slurm (and container.sh, which
# docker and podman jobs have); their server.sh would be copies of the default's.
SAME_SERVER_SH = (
    "docker-setup-steps",
    "podman",
    "enroot",
    "apptainer",
    "none",
    "docker-mounts-sbatch",
    "enroot-mounts-sbatch",
    "apptainer-mounts-sbatch",
    "docker-secrets",
    "apptainer-secrets",
)


def _scripts(case: str) -> list[str]:
    recipe, overrides, cluster = variant(case)
    runtime = load_recipe(recipe, overrides, cluster=cluster).recipe.container.runtime
    out = ["job.slurm"]
    if not (case.startswith("dsr1-fp8-mi355x-moriio-1p2d--") and case.split("--")[1] in SAME_SERVER_SH):
        out.append("server.sh")
    if runtime in ("docker", "podman"):
        out.append("container.sh")
    return out


GOLDEN_CASES = [(case, script) for case in sorted(VARIANTS) for script in _scripts(case)]


@pytest.mark.parametrize("case, script", GOLDEN_CASES)
def test_golden(case: str, script: str, tmp_path: Path) -> None:
    text = (render_case(case, tmp_path) / script).read_text()
    golden = GOLDEN / case / script
    # Goldens are rewritten only on purpose, by scripts/update_goldens.py, never by the suite.
    assert text == golden.read_text(), f"{script} of {case} differs from {golden} (see scripts/update_goldens.py)"


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_scripts_pass_bash_n_and_shellcheck(case: str, tmp_path: Path) -> None:
    out = render_case(case, tmp_path)
    for script in ("job.slurm", "server.sh", "container.sh"):
        path = out / script
        if script == "container.sh" and not path.exists():
            continue
        r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([_shellcheck(), "-x", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("runtime", ["none", "docker", "podman", "enroot", "apptainer"])
def test_every_container_runtime_renders_clean_shell(runtime: str, tmp_path: Path) -> None:
    out = render_recipe("dsr1-fp8-mi355x-moriio-1p2d", tmp_path, [f"container.runtime={runtime}"])
    default = render_recipe("dsr1-fp8-mi355x-moriio-1p2d", tmp_path / "default")
    body = lambda d: (d / "server.sh").read_text().split("\n", 2)[2]  # noqa: E731 - past the fingerprint line
    assert body(out) == body(default)
    job = (out / "job.slurm").read_text()
    r = subprocess.run([_shellcheck(), str(out / "job.slurm")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    launch = {
        "none": 'bash "$RUN_DIR/server.sh"',
        "docker": 'bash "$RUN_DIR/container.sh"',
        "podman": 'bash "$RUN_DIR/container.sh"',
        "enroot": "--container-image=",
        "apptainer": "apptainer exec",
    }[runtime]
    assert launch in job
    if runtime in ("docker", "podman"):
        wrapper = (out / "container.sh").read_text()
        assert f"RUNTIME={runtime}\n" in wrapper
        # The stock vLLM images' entrypoint is `vllm`: every container overrides it.
        assert (
            '--entrypoint ""' in wrapper and '"$RUNTIME" run "${ARGS[@]}" "$IMAGE" bash "$RUN_DIR/server.sh"' in wrapper
        )
        r = subprocess.run([_shellcheck(), str(out / "container.sh")], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout
    else:
        assert not (out / "container.sh").exists()


def test_dsr1_commands(tmp_path: Path) -> None:
    server = (render_recipe("dsr1-fp8-mi355x-moriio-1p2d", tmp_path) / "server.sh").read_text()
    assert server.count("exec vllm serve deepseek-ai/DeepSeek-R1-0528") == 3
    assert server.count("--enable-expert-parallel") == 2  # decode only
    assert '\\"kv_role\\":\\"kv_producer\\"' in server
    assert server.count('\\"kv_role\\":\\"kv_consumer\\"') == 2
    assert '\\"proxy_ip\\":\\"${PDBENCH_NODE_0_ADDR}\\"' in server
    # vLLM 0.32 reads the all-to-all backend from its flag only (VLLM_ALL2ALL_BACKEND was removed).
    assert server.count("--all2all-backend mori_low_latency") == 2 and "VLLM_ALL2ALL_BACKEND" not in server
    job = (tmp_path / "job.slurm").read_text()
    assert "#SBATCH --nodes=3" in job and "#SBATCH --ntasks=3" in job
    assert "--kill-on-bad-exit=1" in job


def test_nixl_side_channel_ports_are_distinct_per_worker(tmp_path: Path) -> None:
    server = (render_recipe("dsr1-fp8-mi355x-nixl-1p2d", tmp_path) / "server.sh").read_text()
    ports = [line.split("=")[1] for line in server.splitlines() if "VLLM_NIXL_SIDE_CHANNEL_PORT=" in line]
    assert ports == ["5600", "5608", "5616"]  # 8 ranks each
    # NIC detection sets the side-channel host (the RDMA interface's address, else the node's):
    # nothing after it may overwrite it.
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in server and server.count("nic_env=$(") == 3
    tiny = (render_recipe("tiny-fp32-cpu-nixl-1p2d", tmp_path / "tiny", cluster="local") / "server.sh").read_text()
    assert tiny.count('export VLLM_NIXL_SIDE_CHANNEL_HOST="${PDBENCH_NODE_ADDR}"') == 3  # no detection there
    assert '\\"kv_buffer_device\\":\\"cuda\\"' not in server  # plain JSON: no shell expansion needed
    assert (
        '\'{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"cuda",'
        '"kv_load_failure_policy":"fail"}\'' in server
    )


def test_nixl_servers_get_cuda_ipc_get_on_unless_the_recipe_says_otherwise(tmp_path: Path) -> None:
    # UCX turns cuda_ipc's get (NIXL's pull) off without NVLink, e.g. two servers on one GPU.
    server = (render_recipe("tiny-fp32-cpu-nixl-1p2d-vs-agg", tmp_path, cluster="local") / "server.sh").read_text()
    assert server.count("exec vllm serve") == 6  # 1 prefill + 2 decode, then 3 aggregated
    assert server.count("export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y") == 3  # the aggregated servers move no KV
    # UCX prints the protocol it selected into each NIXL server's log: the lane, proven
    # (harness.validity.ucx_lanes), read from the logs/ the client is pointed at.
    assert server.count("export UCX_PROTO_INFO=y") == 3
    bench = json.loads(next(tmp_path.glob("bench*.json")).read_text())
    assert bench["server_logs_dir"] == "logs" and bench["kv_connector"] == "nixl"
    off = render_recipe(
        "tiny-fp32-cpu-nixl-1p2d",
        tmp_path / "off",
        overrides=["env={UCX_CUDA_IPC_ENABLE_GET_ZCOPY: n}"],
        cluster="local",
    )
    server = (off / "server.sh").read_text()
    # The recipe's env: once for the job, then in each of the 3 servers' own environment.
    assert (
        "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" not in server and server.count("export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n") == 4
    )
    bundled = (render_recipe("tiny-fp32-cpu-pdbench-1p1d", tmp_path / "b", cluster="local") / "server.sh").read_text()
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in bundled and "UCX_PROTO_INFO" not in bundled


def test_lock_plan_and_bench_files(tmp_path: Path) -> None:
    out = render_recipe("tiny-fp32-cpu-nixl-1p1d", tmp_path)
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d")
    lock = yaml.safe_load((out / "recipe.lock.yaml").read_text())
    assert lock["fingerprint"] == rr.fingerprint
    assert lock["git_commit"] == "0123abcd" and lock["pdbench_version"]
    assert lock["recipe"]["benchmark"]["isl"] == 256 and lock["model"]["name"] == "tiny-llama"
    plan = json.loads((out / "plan.json").read_text())
    assert [(w["name"], w["node"], w["port"]) for w in plan["workers"]] == [
        ("prefill-0", 0, 8100),
        ("decode-0", 1, 8200),
    ]
    bench = json.loads((out / "bench.json").read_text())
    assert bench["base_url"] == "http://127.0.0.1:30000"
    assert (bench["prefill_gpus"], bench["decode_gpus"]) == (1, 1)
    assert bench["metadata"]["recipe_fingerprint"] == rr.fingerprint


def test_render_never_overwrites(tmp_path: Path) -> None:
    render_recipe("tiny-fp32-cpu-nixl-1p1d", tmp_path)
    before = (tmp_path / "server.sh").read_text()
    with pytest.raises(FileExistsError):
        render_recipe("tiny-fp32-cpu-nixl-1p1d", tmp_path, ["benchmark.isl=512"])
    assert (tmp_path / "server.sh").read_text() == before


def test_override_changes_fingerprint_and_command(tmp_path: Path) -> None:
    a = load_recipe("tiny-fp32-cpu-nixl-1p1d")
    b = load_recipe("tiny-fp32-cpu-nixl-1p1d", ["topology.decode.flags.max-num-seqs=8"])
    assert a.fingerprint != b.fingerprint
    server = (
        render_recipe("tiny-fp32-cpu-nixl-1p1d", tmp_path, ["topology.decode.flags.max-num-seqs=8"]) / "server.sh"
    ).read_text()
    decode = server.split("proc_decode_0()")[1].split("\n}\n")[0]
    assert "--max-num-seqs 8" in decode


def test_multi_node_workers_render_headless_followers(tmp_path: Path) -> None:
    recipe, overrides = VARIANTS["dsr1-fp8-mi355x-moriio-1p2d--decode-dp16-over-2-nodes"]
    server = (render_recipe(recipe, tmp_path, overrides) / "server.sh").read_text()
    leader = server.split("proc_decode_0()")[1].split("\n}\n")[0]
    follower = server.split("proc_decode_0_f1()")[1].split("\n}\n")[0]
    for text in (leader, follower):
        assert "--data-parallel-size 16" in text and "--data-parallel-size-local 8" in text
        assert '--data-parallel-address "${PDBENCH_NODE_1_ADDR}"' in text
    assert "--headless" not in leader
    assert "--headless" in follower and "--data-parallel-start-rank 8" in follower
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [(p["name"], p["node"], p["kind"]) for p in plan["processes"]][1:3] == [
        ("decode-0", 1, "server"),
        ("decode-0-f1", 2, "follower"),
    ]

    recipe, overrides = VARIANTS["dsr1-fp8-mi355x-nixl-1p2d--prefill-tp16-over-2-nodes"]
    server = (render_recipe(recipe, tmp_path / "tp", overrides) / "server.sh").read_text()
    follower = server.split("proc_prefill_0_f1()")[1].split("\n}\n")[0]
    assert "--tensor-parallel-size 16" in follower and "--nnodes 2" in follower
    assert "--node-rank 1" in follower and "--headless" in follower
    assert '--master-addr "${PDBENCH_NODE_0_ADDR}"' in follower


def test_bundled_connector_gets_a_kv_port_per_worker(tmp_path: Path) -> None:
    server = (
        render_recipe("dsr1-fp8-mi355x-nixl-1p2d", tmp_path, ["connector.name=pdbench"]) / "server.sh"
    ).read_text()
    configs = [line for line in server.splitlines() if "--kv-transfer-config" in line]
    ports = [int(re.search(r'\\"port\\":(\d+)', line).group(1)) for line in configs]
    assert ports == [5600, 5608, 5616]
    # Every setting in the kv-transfer-config, none in the environment.
    assert all('\\"host\\":\\"${PDBENCH_NODE_ADDR}\\"' in line for line in configs)
    assert all('\\"secret_file\\":\\"${RUN_DIR}/state/kv_secret\\"' in line for line in configs)
    assert "PDBENCH_KV_" not in server
    assert (
        '\\"kv_connector_module_path\\":\\"connector\\"' in server or '"kv_connector_module_path":"connector"' in server
    )


def test_run_dir_that_no_sbatch_line_can_carry_is_refused(tmp_path: Path) -> None:
    from harness.config import ConfigError

    out = tmp_path / "a\\b"
    out.mkdir()
    with pytest.raises(ConfigError, match="#SBATCH"):
        render_job(load_recipe("tiny-fp32-cpu-nixl-1p1d"), out, RenderContext(str(out), "/opt/pdbench", "/py", None))


def test_top_level_kv_transfer_config_keys_from_the_recipe(tmp_path: Path) -> None:
    out = render_recipe(
        "dsr1-fp8-mi355x-moriio-1p2d", tmp_path, ['connector.transfer_config={"kv_load_failure_policy": "recompute"}']
    )
    assert (out / "server.sh").read_text().count('\\"kv_load_failure_policy\\":\\"recompute\\"') == 3
    from harness.config.load import ConfigError

    with pytest.raises(ConfigError, match=r"connector\.transfer_config\.engine_id"):
        load_recipe("dsr1-fp8-mi355x-moriio-1p2d", ['connector.transfer_config={"engine_id": "x"}'])


SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("recipe", SHIPPED)
def test_every_shipped_recipe_renders_clean_shell(recipe: str, tmp_path: Path) -> None:
    # The catalogue beyond the golden cases: each renders, and its scripts pass bash -n and
    # shellcheck (tests/render/test_vllm_flags.py runs their serve lines through vLLM's parser).
    out = render_recipe(recipe, tmp_path)
    scripts = [p for p in (out / n for n in ("job.slurm", "server.sh", "container.sh")) if p.exists()]
    for path in scripts:
        r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    r = subprocess.run([_shellcheck(), "-x", *map(str, scripts)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    plan = json.loads((out / "plan.json").read_text())
    topo = load_recipe(recipe).recipe.topology
    if topo.aggregated is not None:
        phases = {"aggregated"} if topo.aggregated_only else {"disagg", "aggregated"}
        assert {p["phase"] for p in plan["processes"]} == phases


def test_proxy_and_client_processes_from_the_recipe(tmp_path: Path) -> None:
    """proxy.workers reaches the proxy's command line (both phases), benchmark.workers the
    client's config; MoRI-IO, whose registrations live in one proxy process, refuses more."""
    out = render_recipe(
        "tiny-fp32-cpu-nixl-1p2d-vs-agg", tmp_path, ["proxy.workers=2", "benchmark.workers=3"], cluster="local"
    )
    server = (out / "server.sh").read_text()
    assert server.count("--workers 2") == 2, server
    assert json.loads((out / "bench.json").read_text())["workers"] == 3
    plain = (render_recipe("tiny-fp32-cpu-nixl-1p1d", tmp_path / "plain") / "server.sh").read_text()
    assert "--workers" not in plain
    with pytest.raises(ConfigError, match=r"proxy\.workers: MoRI-IO"):
        load_recipe("dsr1-fp8-mi355x-moriio-1p2d", ["proxy.workers=2"])
