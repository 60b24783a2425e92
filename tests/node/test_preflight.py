"""The node preflight checks (harness.node.preflight) against real resources: real sockets,
fake `nvidia-smi` / `amd-smi` executables on a PATH, model directories and Hugging Face
cache layouts in tmp_path, a fake /sys for RDMA, and real clocks and filesystems."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers.gpu_fakes import fake_nvidia_smi, fake_tool
from helpers.nic_fakes import add_device, roce_port

from harness.node import preflight as pf
from harness.node.preflight import clock
from harness.node.preflight.gpu_holders import BUSY_HINT

# The fake tools run with a PATH of their own directory only.
SLEEP, CAT = shutil.which("sleep"), shutil.which("cat")

# --------------------------------------------------------------------------- ports


def _listener(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    s.listen()
    return s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def test_free_port_passes() -> None:
    assert pf.check_ports([_free_port()]) == []
    assert pf.check_ports([]) == []


def test_port_in_use_names_the_holder() -> None:
    with _listener("0.0.0.0") as holder:
        port = holder.getsockname()[1]
        problems = pf.check_ports([port])
    assert len(problems) == 1
    assert problems[0].startswith(f"port {port} is in use (by pid {os.getpid()} "), problems
    assert "stop that process" in problems[0]


def test_port_held_on_another_address_conflicts_with_wildcard() -> None:
    # A server on 127.0.0.1:P still stops ours from binding 0.0.0.0:P.
    with _listener("127.0.0.1") as holder:
        port = holder.getsockname()[1]
        assert pf.check_ports([port]) and pf.check_ports([port])[0].startswith(f"port {port} is in use")


def test_holder_left_out_when_unknown() -> None:
    # A socket bound but not listening takes the port, yet /proc/net/tcp does not list it.
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        port = s.getsockname()[1]
        problems = pf.check_ports([port])
    assert problems == [
        f"port {port} is in use; stop that process (a server left over from an earlier job?) or move the recipe's ports"
    ]


def test_time_wait_does_not_count_as_in_use() -> None:
    with _listener() as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end (port P) goes to TIME_WAIT
        time.sleep(0.05)
        client.close()
    time.sleep(0.05)
    states = {
        line.split()[3]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if int(line.split()[1].rsplit(":", 1)[1], 16) == port
    }
    assert "06" in states, states  # TIME_WAIT really is there
    assert pf.check_ports([port]) == []


def test_duplicate_and_invalid_ports() -> None:
    port = _free_port()
    problems = pf.check_ports([port, port, 0, 70000])
    assert (
        problems[0] == f"port {port} is assigned twice on this node; two servers would collide (fix the recipe's ports)"
    )
    assert "port 0 is not a TCP port number" in problems[1] and "port 70000 is not" in problems[2]


# --------------------------------------------------------------------------- GPUs


def test_no_gpu_tool(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    env = {"PATH": str(tmp_path / "empty")}
    assert pf.check_gpus(8, env=env) == [
        "no GPU tool (nvidia-smi or amd-smi) on PATH; the recipe needs 8 GPU(s) on this node"
    ]
    assert pf.check_gpus(0, env=env) == []


def test_idle_nvidia_gpus_pass(tmp_path: Path) -> None:
    env = fake_nvidia_smi(tmp_path, 8)
    assert pf.check_gpus(8, env=env) == []
    assert pf.check_gpus(4, vendor="nvidia", env=env) == []


def test_busy_nvidia_gpu_names_index_and_pid(tmp_path: Path) -> None:
    env = fake_nvidia_smi(tmp_path, 8, apps=[(3, 4321, "71234"), (5, 77, "[N/A]"), (6, 88, "0")], used={3: 71240})
    problems = pf.check_gpus(8, env=env)
    assert problems[0].startswith("GPU 3 is busy: pid 4321 holds 71234 MiB (an orphaned container or another job?)")
    assert problems[1].startswith("GPU 5 is busy: pid 77 holds GPU memory (amount not reported)")
    assert len(problems) == 2, problems  # a process holding 0 MiB is not a holder


def test_nvidia_memory_in_use_without_a_visible_process(tmp_path: Path) -> None:
    env = fake_nvidia_smi(tmp_path, 2, used={1: 40000})
    (problem,) = pf.check_gpus(2, env=env)
    assert problem.startswith("GPU 1 has 40000 MiB in use but nvidia-smi lists no process on it")


def test_too_few_nvidia_gpus(tmp_path: Path) -> None:
    env = fake_nvidia_smi(tmp_path, 2)
    (problem,) = pf.check_gpus(8, env=env)
    assert problem.startswith("2 GPU(s) visible, the recipe needs 8 on this node")


def test_hanging_gpu_tool_is_reported_in_time(tmp_path: Path) -> None:
    fake_tool(tmp_path / "bin", "nvidia-smi", f"#!/bin/sh\n{SLEEP} 30\n")
    start = time.monotonic()
    (problem,) = pf.check_gpus(8, env={"PATH": str(tmp_path / "bin")}, timeout_s=1)
    assert time.monotonic() - start < 3
    assert "did not answer within 1 s" in problem and "nvidia-smi" in problem, problem


def test_failing_gpu_tool(tmp_path: Path) -> None:
    fake_tool(
        tmp_path / "bin",
        "nvidia-smi",
        '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2\nexit 9\n',
    )
    (problem,) = pf.check_gpus(1, env={"PATH": str(tmp_path / "bin")})
    assert "failed (exit 9: NVIDIA-SMI has failed because it couldn't communicate" in problem, problem
    assert "needs 1 GPU(s)" in problem


# amd-smi (ROCm 6.2/6.3) `list --json`: one entry per GPU.
AMD_LIST = [
    {
        "gpu": i,
        "bdf": f"0000:{0x0C + i:02x}:00.0",
        "uuid": f"{i:02x}ff74a1-0000-1000-80c4-4c2be5e66537",
        "kfd_id": 1000 + i,
    }
    for i in range(8)
]


def _amd_process(busy: dict[int, list[dict]]) -> list[dict]:
    """amd-smi `process --json`: each GPU's process_list; without processes, one
    {"process_info": "No running processes detected"} placeholder."""
    return [
        {"gpu": i, "process_list": busy.get(i) or [{"process_info": "No running processes detected"}]} for i in range(8)
    ]


def _amd_proc(pid: int, vram: int, unit: str = "B", flat: bool = False) -> dict:
    info = {
        "name": "python3",
        "pid": pid,
        "memory_usage": {
            "gtt_mem": {"value": 2097152, "unit": "B"},
            "cpu_mem": {"value": 1234567, "unit": "B"},
            "vram_mem": {"value": vram, "unit": unit},
        },
        "mem_usage": {"value": vram, "unit": unit},
        "usage": {"gfx": {"value": 0, "unit": "ns"}, "enc": {"value": 0, "unit": "ns"}},
    }
    return info if flat else {"process_info": info}


def fake_amd_smi(tmp_path: Path, gpus: list[dict], processes: object) -> dict:
    (tmp_path / "list.json").write_text(json.dumps(gpus, indent=4))
    proc = processes if isinstance(processes, str) else json.dumps(processes, indent=4)
    (tmp_path / "process.json").write_text(proc)
    fake_tool(
        tmp_path / "bin",
        "amd-smi",
        f'#!/bin/sh\ncase "$1 $2" in\n  "list --json") {CAT} {tmp_path}/list.json ;;\n'
        f'  "process --json") {CAT} {tmp_path}/process.json ;;\n  *) exit 2 ;;\nesac\n',
    )
    return {"PATH": str(tmp_path / "bin")}


def test_idle_amd_gpus_pass(tmp_path: Path) -> None:
    env = fake_amd_smi(tmp_path, AMD_LIST, _amd_process({}))
    assert pf.check_gpus(8, env=env) == []
    # A listed process without VRAM (amd-smi itself, in newer versions) is not a holder.
    env = fake_amd_smi(tmp_path, AMD_LIST, _amd_process({2: [_amd_proc(99, 0)]}))
    assert pf.check_gpus(8, vendor="amd", env=env) == []


def test_busy_amd_gpu(tmp_path: Path) -> None:
    busy = {3: [_amd_proc(4321, 71234 << 20)], 5: [_amd_proc(55, 2048, unit="MB", flat=True)]}
    env = fake_amd_smi(tmp_path, AMD_LIST, _amd_process(busy))
    problems = pf.check_gpus(8, env=env)
    assert problems == [
        "GPU 3 is busy: pid 4321 (python3) holds 71234 MiB " + BUSY_HINT,
        "GPU 5 is busy: pid 55 (python3) holds 2048 MiB " + BUSY_HINT,
    ]


def test_amd_too_few_and_unreadable_output(tmp_path: Path) -> None:
    env = fake_amd_smi(tmp_path, AMD_LIST[:2], "No running processes detected\n")
    assert pf.check_gpus(8, env=env)[0].startswith("2 GPU(s) visible, the recipe needs 8 on this node")
    assert len(pf.check_gpus(2, env=env)) == 0
    env = fake_amd_smi(tmp_path, AMD_LIST, "Traceback (most recent call last): ...\n")
    (problem,) = pf.check_gpus(8, env=env)
    assert problem.startswith("could not read `amd-smi process --json`"), problem


def test_hanging_amd_smi(tmp_path: Path) -> None:
    fake_tool(tmp_path / "bin", "amd-smi", f"#!/bin/sh\n{SLEEP} 30\n")
    start = time.monotonic()
    (problem,) = pf.check_gpus(8, env={"PATH": str(tmp_path / "bin")}, timeout_s=1)
    assert time.monotonic() - start < 3 and "`amd-smi list --json` did not answer within 1 s" in problem


def test_auto_prefers_nvidia_smi(tmp_path: Path) -> None:
    env = fake_nvidia_smi(tmp_path, 1)
    fake_tool(tmp_path / "bin", "amd-smi", "#!/bin/sh\nexit 1\n")
    assert pf.check_gpus(1, env=env) == []
    assert pf.check_gpus(1, vendor="amd", env=env)[0].startswith("`amd-smi list --json` failed (exit 1)")


# --------------------------------------------------------------------------- weights


def _model(d: Path, weights: tuple[str, ...] = ("model.safetensors",)) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "llama"}')
    for w in weights:
        (d / w).write_bytes(b"\0" * 2048)
    return d


def test_local_model_passes(tmp_path: Path) -> None:
    assert pf.check_weights(str(_model(tmp_path / "m"))) == []
    assert pf.check_weights(None) == []


def test_missing_model_dir(tmp_path: Path) -> None:
    (problem,) = pf.check_weights(str(tmp_path / "models" / "org" / "name"))
    assert problem.startswith(
        f"model directory {tmp_path}/models/org/name does not exist on this node ({tmp_path} does)"
    )


def test_dir_without_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (problem,) = pf.check_weights(str(tmp_path / "m"), need_weights=False)
    assert problem.startswith(f"{tmp_path}/m has no config.json")


def test_config_without_weights(tmp_path: Path) -> None:
    d = _model(tmp_path / "m", weights=("training_args.bin",))
    (problem,) = pf.check_weights(str(d))
    assert problem.startswith(f"{d} has config.json but no weight files (*.safetensors, *.bin, *.pt)")
    assert pf.check_weights(str(d), need_weights=False) == []  # --load-format dummy


def test_truncated_config(tmp_path: Path) -> None:
    d = _model(tmp_path / "m")
    (d / "config.json").write_text('{"model_type": ')
    assert pf.check_weights(str(d)) == [f"{d}/config.json is not valid JSON (a truncated download?)"]


def test_dangling_symlinks_are_unreadable(tmp_path: Path) -> None:
    d = _model(tmp_path / "m", weights=("model-00001-of-00002.safetensors",))
    (d / "model-00002-of-00002.safetensors").symlink_to(tmp_path / "blobs" / "gone")
    (problem,) = pf.check_weights(str(d))
    assert problem == (
        f"{d}: 1 weight file(s) cannot be read: model-00002-of-00002.safetensors "
        "(a symlink to a missing file: an incomplete download?)"
    )
    (d / "config.json").unlink()
    (d / "config.json").symlink_to(tmp_path / "blobs" / "config")
    assert pf.check_weights(str(d), need_weights=False)[0].startswith(
        f"{d}: cannot read config.json (a symlink to a missing"
    )


# The check, in a child that runs unprivileged: a child of root drops to `nobody` once its
# imports are done (the interpreter may live under /root, which nobody may not enter). It
# reports whether it can read the files, so the test proves its precondition.
_CHECK_UNPRIVILEGED = """
import json, os, pwd, sys
from harness.node import preflight as pf
if os.geteuid() == 0:
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
d = sys.argv[1]
try:
    open(os.path.join(d, "model.safetensors"), "rb").close()
    weights_readable = True
except PermissionError:
    weights_readable = False
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "weights_readable": weights_readable,
                  "config_readable": os.access(os.path.join(d, "config.json"), os.R_OK),
                  "problems": pf.check_weights(d)}))
"""


def test_unreadable_weight_file(tmp_path: Path) -> None:
    # As root (CI) the model lives in a directory of its own that `nobody` may enter: pytest's
    # tmp_path is under root's mode-0700 base.
    as_root = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="pdbench-unreadable-")) if as_root else tmp_path
    try:
        base.chmod(0o755)
        d = _model(base / "m")
        (d / "model.safetensors").chmod(0)
        argv = [sys.executable, "-c", _CHECK_UNPRIVILEGED, str(d)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        if as_root:
            shutil.rmtree(base)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    uid = seen["uid"]
    assert uid != 0 and seen["euid"] == uid, seen
    assert seen["config_readable"] and not seen["weights_readable"], seen  # the precondition
    (problem,) = seen["problems"]
    assert problem == f"{d}: 1 weight file(s) cannot be read: model.safetensors (not readable by uid {uid})"


def test_missing_shards_and_lfs_pointers(tmp_path: Path) -> None:
    d = _model(tmp_path / "m", weights=("model-00001-of-00003.safetensors",))
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = {"metadata": {}, "weight_map": {f"layer.{i}.weight": s for i, s in enumerate(shards)}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    (problem,) = pf.check_weights(str(d))
    assert problem == (
        f"{d}: 2 of the 3 weight shards listed in model.safetensors.index.json are missing "
        "(model-00002-of-00003.safetensors, model-00003-of-00003.safetensors): an incomplete download"
    )
    (d / "model.safetensors.index.json").unlink()
    (d / "model-00001-of-00003.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 4955415870\n"
    )
    assert "is a Git LFS pointer, not weights" in pf.check_weights(str(d))[0]


def _hf_cache(cache: Path, hf_id: str, rev: str = "e3ad7cb0f1d0", ref: bool = True, blob: bool = True) -> Path:
    repo = cache / f"models--{hf_id.replace('/', '--')}"
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "cfg").write_text("{}")
    (snap / "config.json").symlink_to("../../blobs/cfg")
    if blob:
        (repo / "blobs" / "w1").write_bytes(b"\0" * 4096)
    (snap / "model.safetensors").symlink_to("../../blobs/w1")
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(rev)
    return snap


def test_hf_cache_present(tmp_path: Path) -> None:
    _hf_cache(tmp_path / "hub", "deepseek-ai/DeepSeek-R1-0528")
    assert pf.check_weights(None, hf_id="deepseek-ai/DeepSeek-R1-0528", hf_cache=str(tmp_path / "hub")) == []
    _hf_cache(tmp_path / "hub2", "Qwen/Qwen3-0.6B", ref=False)  # no refs/main: any snapshot
    assert pf.check_weights(None, hf_id="Qwen/Qwen3-0.6B", hf_cache=str(tmp_path / "hub2")) == []


def test_hf_cache_absent(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    cache.mkdir()
    (problem,) = pf.check_weights(None, hf_id="deepseek-ai/DeepSeek-R1-0528", hf_cache=str(cache))
    assert problem.startswith(
        f"deepseek-ai/DeepSeek-R1-0528 is not in the Hugging Face cache {cache} "
        "(no models--deepseek-ai--DeepSeek-R1-0528/snapshots/*/config.json); "
        "HF_HUB_OFFLINE=1 is set, so vLLM would not download it"
    )
    (problem,) = pf.check_weights(None, hf_id="org/name", hf_cache=str(tmp_path / "nope"))
    assert problem.startswith(f"Hugging Face cache {tmp_path}/nope does not exist on this node")


def test_hf_cache_ref_without_snapshot_and_missing_blob(tmp_path: Path) -> None:
    snap = _hf_cache(tmp_path / "hub", "org/name")
    (snap.parent.parent / "refs" / "main").write_text("ffff000011112222")
    (problem,) = pf.check_weights(None, hf_id="org/name", hf_cache=str(tmp_path / "hub"))
    assert (
        "refs/main names revision ffff000011112222, but models--org--name/snapshots/ffff000011112222/config.json is missing"
        in problem
    )
    _hf_cache(tmp_path / "hub2", "org/name", blob=False)
    (problem,) = pf.check_weights(None, hf_id="org/name", hf_cache=str(tmp_path / "hub2"))
    assert (
        problem.startswith("org/name in the Hugging Face cache: ")
        and "model.safetensors (a symlink to a missing file" in problem
    )
    assert pf.check_weights(None, hf_id="org/name", hf_cache=str(tmp_path / "hub2"), need_weights=False) == []


# --------------------------------------------------------------------------- disk, memory


def test_disk(tmp_path: Path) -> None:
    assert pf.check_disk(str(tmp_path), 1) == []
    assert pf.check_disk(str(tmp_path / "not" / "yet"), 1) == []  # checked where it will be created
    (problem,) = pf.check_disk(str(tmp_path), 1 << 60)
    assert problem.startswith("only ") and f"free on the filesystem of {tmp_path}, 1048576.0 TiB needed" in problem


MEMINFO = "MemTotal:       2113390592 kB\nMemFree:        1900000000 kB\nMemAvailable:   2000000000 kB\n"


def test_memory(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    assert pf.check_memory(400 << 30, meminfo, cgroup_root=None) == []
    (problem,) = pf.check_memory(1 << 60, meminfo, cgroup_root=None)
    assert problem.startswith("only 1.9 TiB of host memory is available (MemAvailable), the servers on this node need")
    assert pf.check_memory(1 << 60)  # the real /proc/meminfo: nobody has an exbibyte
    assert pf.check_memory(1 << 20) == []
    assert pf.check_memory(0, tmp_path / "missing") == []


def test_memory_cgroup_v2_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    root = tmp_path / "cg"
    job = root / "system.slice" / "slurmstepd.scope" / "job_42"
    job.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (job / "memory.max").write_text(f"{64 << 30}\n")
    (job / "memory.current").write_text(f"{10 << 30}\n")
    (job / "memory.stat").write_text(f"anon 1000\ninactive_file {6 << 30}\n")
    (job.parent / "memory.max").write_text("max\n")
    (job.parent / "memory.current").write_text(f"{100 << 30}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/slurmstepd.scope/job_42\n")
    (problem,) = pf.check_memory(400 << 30, meminfo, cgroup_root=root, proc_cgroup=proc)
    assert problem.startswith(f"this job's memory limit leaves 60.0 GiB (cgroup {job}: limit 64.0 GiB, 4.0 GiB in use)")
    assert "--mem" in problem
    assert pf.check_memory(50 << 30, meminfo, cgroup_root=root, proc_cgroup=proc) == []


def test_memory_cgroup_v1_limit_inside_a_container(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    mem = tmp_path / "cg" / "memory"
    mem.mkdir(parents=True)  # the container sees its own cgroup at the mount's root
    (mem / "memory.limit_in_bytes").write_text(f"{32 << 30}\n")
    (mem / "memory.usage_in_bytes").write_text(f"{1 << 30}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpuacct,cpu:/\n4:memory:/slurm/uid_1000/job_42\n0::/\n")
    (problem,) = pf.check_memory(40 << 30, meminfo, cgroup_root=tmp_path / "cg", proc_cgroup=proc)
    assert problem.startswith("this job's memory limit leaves 31.0 GiB")
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    assert pf.check_memory(40 << 30, meminfo, cgroup_root=tmp_path / "cg", proc_cgroup=proc) == []


# --------------------------------------------------------------------------- RDMA


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    root.mkdir()
    return root


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "nobin").mkdir()
    return {"PATH": str(tmp_path / "nobin")}


def test_rdma_active(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0")})
    add_device(sysfs, "mlx5_1", {1: roce_port("10.0.0.2", "eth1", state="1: DOWN")})
    assert pf.check_rdma(sysfs, env) == []


def test_no_rdma_device(sysfs: Path, env: dict[str, str]) -> None:
    assert pf.check_rdma(sysfs, env) == [
        f"no RDMA device under {sysfs}/class/infiniband; the connector needs RDMA "
        "(set topology.nic_detection=false to use TCP)"
    ]


def test_rdma_no_active_port(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0", state="1: DOWN")})
    add_device(sysfs, "mlx5_1", {1: roce_port("10.0.0.2", "eth1", state="2: INIT")})
    (problem,) = pf.check_rdma(sysfs, env)
    assert problem.startswith("no RDMA port is ACTIVE (mlx5_0 port 1 is DOWN, mlx5_1 port 1 is INIT)")
    assert "topology.nic_detection=false" in problem


def test_rdma_ibdevices_errors(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0")})
    add_device(sysfs, "mlx5_1", {1: roce_port("10.0.0.2", "eth1", state="1: DOWN")})
    (problem,) = pf.check_rdma(sysfs, {**env, "IBDEVICES": "mlx5_7"})
    assert problem.startswith("IBDEVICES names RDMA device(s) not on this node: mlx5_7 (present: mlx5_0, mlx5_1)")
    (problem,) = pf.check_rdma(sysfs, {**env, "IBDEVICES": "mlx5_1"})
    assert "IBDEVICES=mlx5_1: none of its ports is ACTIVE" in problem


# --------------------------------------------------------------------------- clock


def test_clock_in_sync(tmp_path: Path) -> None:
    assert pf.check_clock(tmp_path) == []
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


@pytest.mark.parametrize(("offset", "how"), [(3.2, "ahead of it"), (-5.0, "behind it")])
def test_clock_skew(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offset: float, how: str) -> None:
    monkeypatch.setattr(clock, "_now", lambda: time.time() + offset)
    (problem,) = pf.check_clock(tmp_path)
    assert problem.startswith(
        f"this node's clock is {abs(offset):.1f} s off the shared filesystem's ({how}); run chrony/NTP"
    )
    assert list(tmp_path.iterdir()) == []
    assert pf.check_clock(tmp_path, max_skew_s=10) == []


def test_clock_unwritable_dir(tmp_path: Path) -> None:
    (problem,) = pf.check_clock(tmp_path / "missing")
    assert problem.startswith(f"cannot write to the shared run directory {tmp_path}/missing")


# --------------------------------------------------------------------------- run_checks


def test_run_checks_bounds_and_orders() -> None:
    release = threading.Event()

    def hang() -> list[str]:
        release.wait(30)
        return []

    def boom() -> list[str]:
        raise RuntimeError("sysfs went away")

    checks = {"ports": lambda: [], "gpus": hang, "weights": boom, "disk": lambda: ["a", "b"]}
    start = time.monotonic()
    try:
        problems = pf.run_checks(3, checks, timeout_s=0.5)
    finally:
        release.set()
    assert time.monotonic() - start < 2
    assert [(p.check, p.cause) for p in problems] == [
        ("gpus", "check gpus did not finish within 0.5 s (a hung mount, GPU driver or tool?)"),
        ("weights", "check weights failed: RuntimeError: sysfs went away"),
        ("disk", "a"),
        ("disk", "b"),
    ]
    assert str(problems[2]) == "node 3: a"
    assert pf.run_checks(0, {}) == []


def test_the_real_checks_on_this_machine_are_fast(tmp_path: Path, sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0")})
    gpu_env = fake_nvidia_smi(tmp_path, 8)
    model = _model(tmp_path / "m")
    with _listener("0.0.0.0") as holder:
        taken = holder.getsockname()[1]
        checks = {
            "ports": lambda: pf.check_ports([_free_port(), taken]),
            "gpus": lambda: pf.check_gpus(8, env=gpu_env),
            "weights": lambda: pf.check_weights(str(model)),
            "disk": lambda: pf.check_disk(str(tmp_path), 1 << 30),
            "memory": lambda: pf.check_memory(1 << 20),
            "rdma": lambda: pf.check_rdma(sysfs, env),
            "clock": lambda: pf.check_clock(tmp_path),
        }
        start = time.monotonic()
        problems = pf.run_checks(0, checks)
    assert time.monotonic() - start < 10
    assert [p.check for p in problems] == ["ports"] and f"port {taken} is in use" in problems[0].cause
