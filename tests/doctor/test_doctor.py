"""`pdbench doctor` and the preflight every job runs before starting a server, on this machine
(the local launcher): it passes on a healthy machine, and each planted fault (a port in use,
missing weights, a busy or missing GPU) fails with exit 1, one line naming the node and the
cause, in seconds; a real job with the same fault fails before any server starts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import port_base
from helpers.gpu_fakes import fake_nvidia_smi

from harness.config.load import PROJECT_ROOT

RECIPE = "tiny-fp32-cpu-nixl-1p1d"


def _ports() -> list[str]:
    base = port_base(21100)
    return [
        f"topology.prefill.port={base}",
        f"topology.decode.port={base + 10}",
        f"connector.side_channel_port={base + 20}",
        f"proxy.port={base + 30}",
    ]


def _doctor(tmp_path: Path, *sets: str, env: dict | None = None, recipe: str = RECIPE) -> tuple[int, dict, float]:
    """The nodes' checks: vLLM's flag check (an import of vLLM, ~20 s of CPU) is skipped, as the
    option lets a user skip it; test_doctor_lists_what_passed runs it."""
    args = [sys.executable, "-m", "harness", "doctor", "--recipe", recipe, "--launcher", "local", "--json"]
    args += ["--skip-flag-check"]
    args += ["--results-dir", str(tmp_path / "results")]
    for s in [*_ports(), *sets]:
        args += ["--set", s]
    start = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, timeout=240, env=env, cwd=PROJECT_ROOT)
    took = time.monotonic() - start
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout), took


def _fake_gpu_tool(tmp_path: Path, busy: bool, count: int = 1) -> dict:
    """The environment with test_preflight's stub `nvidia-smi` first on PATH; busy: pid 4242
    holds 71234 MiB on GPU 0."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    stub = fake_nvidia_smi(tmp_path, count, apps=[(0, 4242, "71234")] if busy else [])
    return dict(os.environ, PATH=f"{stub['PATH']}:{os.environ['PATH']}")


def test_doctor_passes_on_a_healthy_machine(tmp_path: Path) -> None:
    rc, out, took = _doctor(tmp_path)
    assert (rc, out["problems"]) == (0, []), out
    records = sorted((Path(out["run_dir"]) / "state").glob("preflight-node*.json"))
    assert [json.loads(r.read_text())["problems"] for r in records] == [[], []]
    assert "ports" in json.loads(records[0].read_text())["checks"]
    # It says what passed, not only "ok": each node's checks, as each node recorded them.
    ran = {p["where"]: p["checks"] for p in out["passed"]}
    assert "submit host" not in ran, out  # --skip-flag-check: vLLM's flag check is not claimed
    assert [ran[f"node {n}"] for n in (0, 1)] == [json.loads(r.read_text())["checks"] for r in records], out
    # Kept apart from the benchmark's runs, and no server was started.
    assert "/.doctor/" in out["run_dir"] and not list((Path(out["run_dir"]) / "logs").glob("prefill-*.log"))
    assert took < 60


def test_doctor_names_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", port_base(21100) + 10))  # decode's HTTP port, on node 1
        holder.listen()
        rc, out, _ = _doctor(tmp_path)
    assert rc == 1
    lines = [f"{p['where']}: {p['cause']}" for p in out["problems"]]
    assert any(
        line.startswith(f"node 1: port {port_base(21100) + 10} is in use") and str(os.getpid()) in line
        for line in lines
    ), lines
    # The failed check is not listed as passed on the node that failed it; the other node's is.
    ran = {p["where"]: p["checks"] for p in out["passed"]}
    assert "ports" not in ran["node 1"] and "ports" in ran["node 0"] and "disk" in ran["node 1"], out


def test_doctor_lists_what_passed(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "harness", "doctor", RECIPE, "--launcher", "local"]
    args += ["--results-dir", str(tmp_path / "results"), *(a for s in _ports() for a in ("--set", s))]
    r = subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=PROJECT_ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1].startswith("ok: 2 node(s) checked in "), lines
    assert "passed: submit host: vllm-flags" in lines, lines  # the installed vLLM parsed the serve lines
    for node in (0, 1):
        (line,) = [ln for ln in lines if ln.startswith(f"passed: node {node}: ")]
        assert {"ports", "disk", "memory"} <= set(line.split(": ", 2)[2].split(", ")), line


def test_doctor_names_missing_weights(tmp_path: Path) -> None:
    # An HF-id model under a model root this host does not see: every node checks it.
    rc, out, _ = _doctor(tmp_path, "model=deepseek-r1-0528-fp8", "site.model_root=/nonexistent/models")
    assert rc == 1
    where = sorted({p["where"] for p in out["problems"] if p["check"] == "weights"})
    assert where == ["node 0", "node 1"], out["problems"]
    assert all("/nonexistent/models/deepseek-ai/DeepSeek-R1-0528" in p["cause"] for p in out["problems"])
    # A model root the submit host sees, without the model: caught here before anything runs.
    (tmp_path / "models").mkdir()
    rc, out, _ = _doctor(tmp_path, "model=deepseek-r1-0528-fp8", f"site.model_root={tmp_path / 'models'}")
    assert rc == 1 and any(p["where"] == "submit host" and p["check"] == "weights" for p in out["problems"])


def test_doctor_names_a_busy_gpu_and_too_few(tmp_path: Path) -> None:
    env = _fake_gpu_tool(tmp_path, busy=True)
    rc, out, _ = _doctor(tmp_path, "topology.gpus_per_node=1", env=env)
    assert rc == 1
    gpu = [p for p in out["problems"] if p["check"] == "gpus"]
    assert {p["where"] for p in gpu} == {"node 0", "node 1"} and all("4242" in p["cause"] for p in gpu), gpu
    env = _fake_gpu_tool(tmp_path / "bin2", busy=False, count=1)
    rc, out, _ = _doctor(tmp_path, "topology.gpus_per_node=2", "topology.prefill.tp=2", env=env)
    assert rc == 1 and any(p["where"] == "node 0" and "needs 2" in p["cause"] for p in out["problems"]), out
    rc, out, _ = _doctor(tmp_path, "topology.gpus_per_node=1", env=_fake_gpu_tool(tmp_path / "bin3", busy=False))
    assert (rc, out["problems"]) == (0, [])


def test_a_job_with_a_planted_fault_fails_before_any_server_starts(tmp_path: Path) -> None:
    env = _fake_gpu_tool(tmp_path, busy=True)
    args = [sys.executable, "-m", "harness", "submit", "--recipe", RECIPE, "--launcher", "local"]
    args += ["--results-dir", str(tmp_path / "results"), "--set", "topology.gpus_per_node=1"]
    for s in _ports():
        args += ["--set", s]
    start = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, timeout=240, env=env, cwd=PROJECT_ROOT)
    took = time.monotonic() - start
    assert r.returncode == 1, r.stdout + r.stderr
    run_dir = next((tmp_path / "results" / RECIPE).iterdir())
    status = json.loads((run_dir / "status.json").read_text())
    assert "preflight found" in status["reason"] and "GPU 0 is busy" in status["reason"], status["reason"]
    assert not list((run_dir / "logs").glob("prefill-*.log")) and not list((run_dir / "logs").glob("decode-*.log"))
    assert took < 60, took
