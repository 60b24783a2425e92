"""The node runtime and the local launcher with real processes but fake servers (no vLLM).

Each test renders the local 1P1D recipe with the real renderer (plan.json, server.sh) and
runs it through harness.launch.local.run_local or `bash server.sh` directly, with the `vllm`
and `python -m harness proxy|bench` of server.sh answered by tests/helpers/node_fakes.py. The
fakes record their PIDs in $RUN_DIR/fakepids/, so every test can check that nothing outlived the job.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from helpers.node_fakes import AGGREGATED_RESULT_NAME, RESULT_NAME, write_bin
from helpers.power_fakes import FAKE_NVIDIA_SMI, fake_bin

from benchmarks.common import free_ports
from harness import tiny_model
from harness.config import load_recipe
from harness.launch.local import _sweep_leftovers, node_env, run_local
from harness.node.coordination import Aborted, Coordination
from harness.node.runtime import FROZEN_S
from harness.reaper import DIED
from harness.render import RenderContext, render_job
from harness.rundir import Failure, RunDir
from harness.rundir.kv_ceiling import read as read_kv_ceiling
from harness.rundir.paths import server_record_name
from harness.rundir.power_samples import read_record
from harness.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[2]
FAKES = Path(__file__).parents[1] / "helpers" / "node_fakes.py"
pytestmark = pytest.mark.timeout(60)

# job_s: the fakes' jobs end in 5-10 s on a quiet machine; a loaded one (a CI building its image
# beside the fast tests) took 28 s, past the 25 s this was, and the happy path ended as a timeout.
# Tests that pin a bound on how long a job takes set their own.
FAST = {"rendezvous_s": 10, "health_s": 10, "smoke_s": 5, "bench_s": 10, "teardown_s": 3, "job_s": 50}


class Job:
    """A run directory as the renderer writes it for 1P1D (prefill-0 and the proxy on node 0,
    decode-0 on node 1), whose processes are the fakes of node_fakes.py."""

    def __init__(
        self,
        run_dir: Path,
        timeouts: dict | None = None,
        flags: dict[str, list[str]] | None = None,
        cpu_bind: str | None = None,
        aggregated: bool = False,
        aggregated_only: bool = False,
        overrides: tuple[str, ...] = (),
    ):
        self.run_dir = run_dir
        self.num_nodes = 2
        self.timeouts = dict(FAST, **(timeouts or {}))
        names = ("prefill-0", "decode-0", "proxy", "kv", "aggregated-0", "aggregated-1")
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        flags = flags or {}
        run_dir.mkdir(parents=True)
        # The plan is the one the renderer writes for the local 1P1D recipe (prefill-0 and
        # the proxy on node 0, decode-0 on node 1), with free ports and short timeouts.
        overrides = [
            f"topology.prefill.port={self.ports['prefill-0']}",
            f"topology.decode.port={self.ports['decode-0']}",
            f"proxy.port={self.ports['proxy']}",
            # (Each node's preflight checks that the KV side-channel ports are free too.)
            f"connector.side_channel_port={self.ports['kv']}",
            f"topology.prefill.cpu_bind={json.dumps([cpu_bind] if cpu_bind else [])}",
            "topology.decode.cpu_bind=[]",
            *(f"timeouts.{k}={v}" for k, v in self.timeouts.items()),
            *overrides,
        ]
        if aggregated:
            # The baseline: two whole instances on node 0 (ports port and port + 1), the same two
            # devices as prefill and decode; node 1 has none and waits for the job's end.
            self.ports["aggregated-1"] = self.ports["aggregated-0"] + 1
            overrides.append(f"topology.aggregated={{nodes: 1, workers: 2, port: {self.ports['aggregated-0']}}}")
            overrides.append(f"topology.aggregated_only={str(aggregated_only).lower()}")
        rr = load_recipe("tiny-fp32-cpu-nixl-1p1d", overrides)
        # The real renderer writes plan.json and server.sh; the `vllm` and `python -m harness
        # proxy|bench` that server.sh runs are node_fakes' wrappers (see the fakes fixture).
        render_job(rr, run_dir, RenderContext(str(run_dir), str(ROOT), sys.executable, None))
        self.plan = json.loads((run_dir / "plan.json").read_text())
        fakes = {"ports": self.ports, "flags": flags}
        (run_dir / "fakes.json").write_text(json.dumps(fakes))

    def run(self, timeout_s: float | None = None) -> tuple[int, float]:
        t0 = time.monotonic()
        rc = run_local(
            self.run_dir, self.num_nodes, timeout_s or self.timeouts["job_s"], self.timeouts["teardown_s"], echo=None
        )
        return rc, time.monotonic() - t0

    def status(self) -> dict:
        return json.loads((self.run_dir / "status.json").read_text())

    def log(self, name: str) -> str:
        p = self.run_dir / "logs" / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def logs(self) -> str:
        """Every log of the run, for assertion messages."""
        out = []
        for p in sorted((self.run_dir / "logs").glob("*")):
            out.append(f"===== {p.name}\n{p.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    # -- the processes of the job -------------------------------------------------------

    def fake_procs(self) -> list[dict]:
        d = self.run_dir / "fakepids"
        return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))] if d.is_dir() else []

    def recorded_procs(self) -> list[dict]:
        out = []
        for rec in sorted((self.run_dir / "state").glob("procs-node*.json")):
            out += json.loads(rec.read_text())
        return out

    def survivors(self) -> list[str]:
        alive = []
        for e in self.fake_procs() + self.recorded_procs():
            p = _same_process(e["pid"], e["create_time"])
            if p is not None:
                alive.append(f"{e['name']} pid {e['pid']}")
        return sorted(set(alive))

    def assert_nothing_left(self, allow: tuple[str, ...] = (), wait: float = 10.0) -> None:
        def left() -> list[str]:
            return [s for s in self.survivors() if s.split(" pid ")[0] not in allow]

        deadline = time.monotonic() + wait  # init reaps orphans asynchronously
        while left() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left() == [], self.logs()
        assert not [p for p in self.ports.values() if _listening(p)]

    def kill_leftovers(self) -> None:
        for f in sorted((self.run_dir / "nodes").glob("*.json")):  # node runtimes first
            try:
                p = psutil.Process(json.loads(f.read_text())["pid"])
                if str(self.run_dir) in " ".join(p.cmdline()):
                    p.kill()
            except (psutil.NoSuchProcess, OSError, ValueError):
                pass
        for e in self.fake_procs() + self.recorded_procs():
            p = _same_process(e["pid"], e["create_time"])
            if p is not None:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass


def _same_process(pid: int, create_time: float) -> psutil.Process | None:
    """The live (non-zombie) process with this PID, unless the PID was reused since."""
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - create_time) > 0.5 or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except psutil.NoSuchProcess:
        return None


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _log_time(line: str) -> float:
    """The asctime of a node log line ('2024-01-02 03:04:05,678 node1 ...') as a Unix time."""
    stamp = " ".join(line.split(" ", 2)[:2])
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


# Before its bench, node 0 measures the KV path's ceiling in a subprocess that imports torch:
# a few seconds, over 15 on a machine loaded by other suites.
BENCH_START_S = 60


def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def fake_python(tmp_path_factory) -> Path:
    return write_bin(tmp_path_factory.mktemp("fakebin"))


@pytest.fixture
def make_job(tmp_path: Path, fake_python: Path, monkeypatch):
    # Every node's preflight checks the recipe's model directory (config and tokenizer of the
    # tiny model, served with dummy weights), as `pdbench submit` builds it.
    tiny_model.build(ROOT / ".cache" / "models" / "tiny-llama")
    # server.sh runs `vllm` from PATH and `$PDBENCH_PYTHON -m harness ...`: both are the fakes'.
    monkeypatch.setenv("PDBENCH_PYTHON", str(fake_python))
    monkeypatch.setenv("PATH", f"{fake_python.parent}{os.pathsep}{os.environ['PATH']}")
    jobs: list[Job] = []

    def make(**kw) -> Job:
        job = Job(tmp_path / f"run{len(jobs)}", **kw)
        jobs.append(job)
        return job

    yield make
    for job in jobs:  # a failing test must not leave fakes behind for the next one
        job.kill_leftovers()


# --- the local launcher, 2 nodes ---------------------------------------------------------


def test_happy_path(make_job) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    job = make_job(cpu_bind=str(cpus[-1]))
    rc, _took = job.run()
    assert rc == 0, job.logs()  # the job ended by itself: the launcher's time limit gives 124

    status = job.status()
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    assert status["reason"] is None
    assert status["results"] == [RESULT_NAME]
    result = json.loads((job.run_dir / RESULT_NAME).read_text())
    assert result["text"] == " fake from proxy"  # the bench's request went through the proxy

    for name in ("prefill-0", "decode-0"):  # the proxy is not scraped, only servers
        before = (job.run_dir / "metrics" / f"{name}.before.prom").read_text()
        after = (job.run_dir / "metrics" / f"{name}.after.prom").read_text()
        assert f'server="{name}"' in before and f'server="{name}"' in after
    assert not list((job.run_dir / "metrics").glob("proxy.*"))

    logs = {p.name for p in (job.run_dir / "logs").glob("*.log")}  # (+ node<i>.out of the launcher)
    assert logs == {
        f"{n}.log" for n in ("prefill-0", "decode-0", "proxy", "bench", "node0", "node1", "power-node0", "power-node1")
    }
    assert "smoke request through the proxy answered ' fake from proxy'" in job.log("node0")
    assert "node 1 finished" in job.log("node1")

    recorded = {e["name"] for e in job.recorded_procs()}
    assert recorded == {"prefill-0", "decode-0", "proxy", "bench", "power-node0", "power-node1"}
    # Each node recorded what its servers run on, in the server's own interpreter (for the results).
    for name, node in (("prefill-0", 0), ("decode-0", 1)):
        rec = json.loads((job.run_dir / "state" / server_record_name(name)).read_text())
        assert (rec["server"], rec["node"], rec["python"]) == (name, node, os.path.normpath(sys.executable))
        assert rec["versions"]["torch"] == importlib.metadata.version("torch"), rec
    nodes = json.loads((job.run_dir / "state" / "procs-node1.json").read_text())
    assert [e["name"] for e in nodes] == ["decode-0", "power-node1"]
    # Node 0 measured the KV ceiling before the sweep, in prefill-0's interpreter (with both
    # servers up on this host: the local launcher's nodes share an address): no CUDA, a host copy.
    ceiling = read_kv_ceiling(job.run_dir / "state" / "kv_ceiling.json")
    assert ceiling is not None and ceiling.status == "measured", ceiling
    assert ceiling.method == "host_memcpy" and ceiling.servers == ["prefill-0", "decode-0"] and ceiling.node == 0
    assert ceiling.gbps is not None and ceiling.gbps > 0 and "KV ceiling: " in job.log("node0")
    # every server ran in its own session, and its forked worker in the server's group
    fakes = {f["name"]: f for f in job.fake_procs()}
    for name in ("prefill-0", "decode-0", "proxy"):
        assert fakes[name]["sid"] == fakes[name]["pid"] == fakes[f"{name}-worker"]["pgid"]
    assert (job.run_dir / "state" / "done").is_file()
    assert not (job.run_dir / "state" / "abort").exists()
    if len(cpus) > 1:  # prefill's whole process tree was kept on the recipe's cpu_bind
        pinned = json.loads((job.run_dir / "fakepids" / "prefill-0-worker.affinity").read_text())
        assert pinned == [cpus[-1]], job.log("node0")
        server = json.loads((job.run_dir / "fakepids" / "prefill-0.affinity").read_text())
        assert server == {"main": [cpus[-1]], "helper": [cpus[-1]]}, job.log("node0")
        assert json.loads((job.run_dir / "fakepids" / "decode-0-worker.affinity").read_text()) == cpus
        server = json.loads((job.run_dir / "fakepids" / "decode-0.affinity").read_text())
        assert server == {"main": cpus, "helper": cpus}  # no cpu_bind: untouched
    job.assert_nothing_left()


def test_server_exits_during_startup(make_job) -> None:
    # A 40 s health bound: noticing the exit only when decode-0 is not healthy in time would take longer.
    job = make_job(
        timeouts={"health_s": 40, "job_s": 55}, flags={"decode-0": ["--exit-after", "1", "--exit-code", "3"]}
    )
    rc, took = job.run()
    assert rc != 0, job.logs()
    assert took < 25, job.logs()
    status = job.status()
    assert status["state"] == "failed" and status["exit_code"] != 0
    # node 1 saw decode-0 die and aborted the job; node 0 stopped on that abort
    assert status["reason"].startswith(
        "decode-0 (decode) on node 1 exited with code 3; last lines of logs/decode-0.log:\n"
    )
    assert "fake start-up failure, exiting with 3" in status["reason"]  # the log tail
    failure = status["failure"]
    assert (failure["node"], failure["process"], failure["role"], failure["cause"]) == (
        1,
        "decode-0",
        "decode",
        "exited with code 3",
    )
    abort = json.loads((job.run_dir / "state" / "abort").read_text())
    assert abort["node"] == 1 and "decode-0" in abort["reason"]
    assert "stopping: decode-0 (decode) on node 1 exited with code 3" in job.log("node0")
    assert status["results"] == [] and not (job.run_dir / "logs" / "bench.log").exists()
    job.assert_nothing_left()  # decode-0's orphaned worker included


def test_a_server_that_exits_0_after_its_engine_died_names_the_engines_error(make_job) -> None:
    # vLLM's API server answers 500s after its engine core died and then exits 0: the cause is
    # lines above the tail (as a prefill on an H200 left it, 2026-12-01).
    crash = (
        "(EngineCore pid=5273) INFO 12-01 04:28:48 [gpu_worker.py:361] Initial free memory 139.29 GiB\\n"
        "terminate called after throwing an instance of 'c10::AcceleratorError'\\n"
        "  what():  CUDA error: unspecified launch failure\\n"
        "(APIServer pid=5131) ERROR 12-01 04:31:41 [async_llm.py:699] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause.\\n"
        + '(APIServer pid=5131) INFO:     127.0.0.1:51032 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\\n'
        * 20
    )
    job = make_job(
        timeouts={"health_s": 40, "job_s": 55},
        flags={"prefill-0": ["--exit-after", "1", "--exit-code", "0", "--crash-log", crash]},
    )
    rc, _ = job.run()
    assert rc != 0, job.logs()
    status = job.status()
    # precondition: the error is out of the quoted tail
    assert "CUDA error" not in status["failure"]["log_tail"], status["failure"]["log_tail"]
    assert status["failure"]["log_error"] == "CUDA error: unspecified launch failure"
    assert status["reason"].startswith(
        "prefill-0 (prefill) on node 0 exited with code 0; its log's first error: CUDA error: unspecified "
        "launch failure; last lines of logs/prefill-0.log:\n"
    ), status["reason"]
    job.assert_nothing_left()


@pytest.mark.parametrize("stuck", ["decode-0", "proxy"])
def test_server_never_healthy(make_job, stuck: str) -> None:
    job = make_job(timeouts={"health_s": 2, "job_s": 40}, flags={stuck: ["--never-healthy"]})
    rc, took = job.run()
    assert rc != 0, job.logs()
    assert took < 25, job.logs()  # the 2 s health bound, not the job's 40 s
    status = job.status()
    assert status["state"] == "failed"
    node = 1 if stuck == "decode-0" else 0
    role = "decode" if stuck == "decode-0" else "proxy"
    assert status["reason"].startswith(
        f"{stuck} ({role}) on node {node} was not healthy within 2 s; last lines of logs/{stuck}.log:"
    ), status
    others = {"decode-0", "proxy", "prefill-0"} - {stuck}
    assert not any(o in status["reason"] for o in others)
    assert status["results"] == []
    job.assert_nothing_left()


def test_bench_fails(make_job) -> None:
    job = make_job(flags={"bench": ["--exit-code", "1"]})
    rc, _ = job.run()
    assert rc == 1, job.logs()
    status = job.status()
    assert status["state"] == "failed" and status["exit_code"] == 1
    assert status["reason"].startswith("bench (benchmark client) on node 0 exited with code 1")
    assert "bench: wrote" in status["reason"]  # the tail of logs/bench.log
    assert status["results"] == [RESULT_NAME]  # the partial result is kept
    assert json.loads((job.run_dir / RESULT_NAME).read_text())["partial"] is True
    # the sweep ended, so the after-scrape was still taken and the other node released
    assert (job.run_dir / "metrics" / "decode-0.after.prom").is_file()
    assert (job.run_dir / "state" / "done").is_file()
    job.assert_nothing_left()


def test_bench_time_limit(make_job) -> None:
    job = make_job(timeouts={"bench_s": 1, "job_s": 40}, flags={"bench": ["--sleep", "60"]})
    rc, took = job.run()
    assert rc == 1, job.logs()
    assert took < 25, job.logs()  # the 1 s bench bound, not the job's 40 s
    status = job.status()
    assert "the benchmark did not finish within 1 s (partial results kept)" in status["reason"]
    assert status["results"] == [RESULT_NAME]
    job.assert_nothing_left()


def test_teardown_escalates_and_reaches_escaped_grandchildren(make_job) -> None:
    # decode-0 (node 1) ignores SIGTERM; prefill-0 (node 0) forks a grandchild into its own
    # session that ignores SIGTERM as well: only SIGKILL through the psutil tree reaches it.
    teardown = 2
    job = make_job(timeouts={"teardown_s": teardown}, flags={"decode-0": ["--ignore-term"], "prefill-0": ["--escapee"]})
    rc, _took = job.run()
    assert rc == 0, job.logs()  # the job ended by itself (its time limit gives 124)

    escapee = next(f for f in job.fake_procs() if f["name"] == "prefill-0-escapee")
    assert escapee["sid"] == escapee["pgid"] == escapee["pid"]
    prefill = next(f for f in job.fake_procs() if f["name"] == "prefill-0")
    assert escapee["sid"] != prefill["sid"]  # it really left the server's session

    node1 = job.log("node1")
    killing = next(line for line in node1.splitlines() if f"ignored SIGTERM for {teardown} s; killing" in line)
    # Node 1 starts its teardown once node 0 marked the job done (within its poll), then gives
    # decode-0 the whole grace before SIGKILL. (Log times are whole milliseconds.)
    done_at = (job.run_dir / "state" / "done").stat().st_mtime
    spent = _log_time(killing) - done_at
    assert teardown - 0.01 <= spent < teardown + 3, spent
    job.assert_nothing_left()


def test_killed_node_runtime(make_job) -> None:
    # Node 1's runtime dies by SIGKILL (no teardown of its own) while node 0 runs the bench:
    # its reaper records the death as the job's cause and kills what the node started (decode-0
    # and its forked worker too); node 0 stops the sweep on it, the client keeping its point.
    job = make_job(timeouts={"bench_s": 40, "job_s": 60}, flags={"bench": ["--sleep", "40", "--keep-on-sigint"]})
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(rc=job.run()[0]), daemon=True)
    runner.start()
    _wait_for(lambda: "bench: wrote" in job.log("bench"), 90, "the bench's point under way")
    node1_pid = json.loads((job.run_dir / "nodes" / "1.json").read_text())["pid"]
    os.kill(node1_pid, signal.SIGKILL)
    runner.join(45)  # well inside the bench's 40 s: the sweep stopped on node 1's death
    assert not runner.is_alive()
    assert result["rc"] != 0, job.logs()
    status = job.status()
    assert status["failure"]["node"] == 1 and status["failure"]["cause"] == DIED, status
    assert "bench: SIGINT, wrote the point as interrupted" in job.log("bench"), job.logs()
    job.assert_nothing_left()


def test_a_frozen_server_is_the_cause_and_stops_the_sweep(make_job) -> None:
    # decode-0 (node 1) is frozen by SIGSTOP mid-sweep: node 1 names it once it stayed stopped
    # FROZEN_S, and node 0 stops its client on that (the point kept as interrupted).
    job = make_job(timeouts={"bench_s": 60, "job_s": 90}, flags={"bench": ["--sleep", "60", "--keep-on-sigint"]})
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(rc=job.run()[0]), daemon=True)
    runner.start()
    try:
        _wait_for(lambda: "bench: wrote" in job.log("bench"), 90, "the bench's point under way")
        # Node 1 polls its own health gate apart from node 0's: frozen before it saw decode-0
        # healthy, that gate's bound would be the cause instead.
        _wait_for(lambda: "node 1 ready" in job.log("node1"), 30, "node 1 past its own health gate")
        decode = next(f for f in job.fake_procs() if f["name"] == "decode-0")
        t0 = time.monotonic()
        os.kill(decode["pid"], signal.SIGSTOP)
        runner.join(50)  # inside the client's 60 s: the job did not wait for it
        assert not runner.is_alive()
        assert time.monotonic() - t0 >= FROZEN_S
    finally:
        if _same_process(decode["pid"], decode["create_time"]) is not None:
            os.kill(decode["pid"], signal.SIGCONT)
    assert result["rc"] != 0, job.logs()
    failure = job.status()["failure"]
    assert (failure["node"], failure["process"], failure["role"]) == (1, "decode-0", "decode"), failure
    assert failure["cause"] == f"was stopped (SIGSTOP) for {FROZEN_S:.0f} s: frozen", failure
    assert "bench: SIGINT, wrote the point as interrupted" in job.log("bench"), job.logs()
    job.assert_nothing_left()


def test_sweep_kills_the_group_of_a_dead_leader(make_job) -> None:
    # A server that died on its own (or by PR_SET_PDEATHSIG when its node runtime was
    # killed) leaves its forked worker behind in its process group.
    job = make_job()
    env = dict(os.environ, RUN_DIR=str(job.run_dir))
    leader = subprocess.Popen(
        [
            sys.executable,
            str(FAKES),
            "server",
            "--name",
            "decode-0",
            "--port",
            str(job.ports["decode-0"]),
            "--exit-after",
            "0.3",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    _wait_for(lambda: len(job.fake_procs()) == 2, 10, "the server and its worker")
    assert leader.wait(10) == 3
    me = next(f for f in job.fake_procs() if f["name"] == "decode-0")
    (job.run_dir / "state").mkdir()
    (job.run_dir / "state" / "procs-node0.json").write_text(
        json.dumps([{"name": "decode-0", "pid": me["pid"], "create_time": me["create_time"]}])
    )
    _sweep_leftovers(job.run_dir)
    job.assert_nothing_left()


def test_supervisor_reports_sigkill_exit_code(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs")
    ignore = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    m = sup.start("stubborn", [sys.executable, "-c", ignore], os.environ)
    try:
        _wait_for(lambda: "up" in m.log_path.read_text(), 10, "the process to start")
        t0 = time.monotonic()
        sup.stop_all(1)
        assert 0.9 <= time.monotonic() - t0 < 6  # the 1 s grace, then SIGKILL
        assert m.popen.poll() is not None and not psutil.pid_exists(m.pid)  # this part holds
    finally:
        if m.popen.poll() is None:
            m.popen.kill()
            m.popen.wait(5)
    assert m.popen.returncode == -signal.SIGKILL


def test_supervisor_kills_escapee_of_a_crashed_server(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RUN_DIR", str(tmp_path))  # where the fakes record their PIDs
    sup = Supervisor(tmp_path / "logs", adopt_orphans=True)  # as the node runtime runs it
    port = free_ports(1)[0]
    argv = [
        sys.executable,
        str(FAKES),
        "server",
        "--name",
        "crashy",
        "--port",
        str(port),
        "--escapee",
        "--exit-after",
        "0.5",
    ]
    m = sup.start("crashy", argv, os.environ)
    escapees: list[dict] = []
    try:
        assert m.popen.wait(10) == 3
        _wait_for(lambda: list(tmp_path.glob("fakepids/crashy-escapee.*.json")), 5, "the escapee")
        escapees = [json.loads(p.read_text()) for p in tmp_path.glob("fakepids/crashy-escapee.*.json")]

        def alive() -> list[int]:
            return [e["pid"] for e in escapees if _same_process(e["pid"], e["create_time"])]

        assert alive() == [e["pid"] for e in escapees]  # it outlived its server, ignoring SIGTERM
        sup.stop_all(1)
        _wait_for(lambda: alive() == [], 10, "the escapee to be killed")
    finally:
        for e in escapees:
            if (p := _same_process(e["pid"], e["create_time"])) is not None:
                p.kill()


def test_smoke_request_failure(make_job) -> None:
    job = make_job(flags={"proxy": ["--completion-status", "500"]})
    rc, _took = job.run()
    assert rc == 1, job.logs()
    job.assert_nothing_left()  # this part holds: the finally block still tears down
    status = job.status()
    assert status["state"] == "failed" and "smoke request got HTTP 500" in status["reason"]
    assert (job.run_dir / "state" / "abort").is_file()


def test_sigterm_to_local_launcher(make_job) -> None:
    job = make_job(timeouts={"bench_s": 30}, flags={"bench": ["--sleep", "60"]})
    code = (
        "import sys; from pathlib import Path; from harness.launch.local import run_local; "
        f"sys.exit(run_local(Path({str(job.run_dir)!r}), 2, 60, {job.timeouts['teardown_s']}, echo=None))"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        _wait_for(lambda: any(f["name"] == "bench" for f in job.fake_procs()), BENCH_START_S, "the bench to start")
        launcher.send_signal(signal.SIGTERM)
        rc = launcher.wait(15)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(5)
    assert rc != 0
    job.assert_nothing_left()
    status = job.status()
    assert status["state"] == "failed"
    assert status["reason"] == "the local launcher: received SIGTERM"  # not a node's echo of it


def test_ctrl_c_to_local_launcher_keeps_the_running_point(make_job) -> None:
    # The terminal's Ctrl-C reaches the launcher alone (each node has its own session); the
    # node stops its client as by Ctrl-C, which writes the point it runs as interrupted.
    job = make_job(timeouts={"bench_s": 30}, flags={"bench": ["--sleep", "60", "--keep-on-sigint"]})
    code = (
        "import sys; from pathlib import Path; from harness.launch.local import run_local; "
        f"sys.exit(run_local(Path({str(job.run_dir)!r}), 2, 60, {job.timeouts['teardown_s']}, echo=None))"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        _wait_for(lambda: "bench: wrote" in job.log("bench"), 60, "the bench's point under way")
        launcher.send_signal(signal.SIGINT)
        rc = launcher.wait(30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(5)
    assert rc == 130, job.logs()
    assert "bench: SIGINT, wrote the point as interrupted" in job.log("bench"), job.logs()
    assert json.loads((job.run_dir / RESULT_NAME).read_text())["stop_reason"] == "interrupted"
    status = job.status()
    assert status["reason"] == "the local launcher: interrupted by the user (Ctrl-C)", status
    assert status["results"] == [RESULT_NAME]
    job.assert_nothing_left()


def test_local_time_limit_is_the_reason(make_job) -> None:
    job = make_job(timeouts={"bench_s": 60}, flags={"bench": ["--sleep", "60"]})
    rc, _took = job.run(timeout_s=3)
    assert rc == 124, job.logs()
    status = job.status()
    assert status["reason"] == "the local launcher: the job reached its time limit of 3 s"
    assert status["failure"]["node"] == "launcher"
    job.assert_nothing_left()


def test_the_launchers_stop_stands_over_a_status_a_node_wrote(tmp_path: Path) -> None:
    # A node that wrote status.json ("exit 1": its servers died of the launcher's own SIGTERM)
    # before it handled its own signal: the job's outcome is still the launcher's time limit.
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    echo_failed = json.dumps({"state": "failed", "exit_code": 1, "reason": "its server died", "failure": None})
    run.server_script.write_text(f"echo '{echo_failed}' > {run.status}\nexec sleep 60\n")
    rc = run_local(run.path, 1, 3, 1, echo=None)
    assert rc == 124
    status = json.loads(run.status.read_text())
    assert (status["exit_code"], status["reason"]) == (124, "the local launcher: the job reached its time limit of 3 s")


def _start_nodes(job: Job) -> list[subprocess.Popen]:
    """The job's node runtimes started the way srun starts them (no launcher in between)."""
    procs = []
    for i in range(job.num_nodes):
        with open(job.run_dir / f"node{i}.out", "wb") as out:
            procs.append(
                subprocess.Popen(
                    ["bash", str(job.run_dir / "server.sh")],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=node_env(job.run_dir, "srun-like", i, job.num_nodes),
                    cwd=job.run_dir,
                    start_new_session=True,
                )
            )
    return procs


def _reap(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def test_sigterm_after_another_node_failed_keeps_that_failure(make_job) -> None:
    # srun --kill-on-bad-exit: node 1 fails and exits, then srun sends SIGTERM to node 0 at
    # once. node 0's status must name node 1's failure, not the SIGTERM that followed it.
    job = make_job(timeouts={"health_s": 30}, flags={"decode-0": ["--exit-after", "1", "--exit-code", "3"]})
    node0, node1 = procs = _start_nodes(job)
    try:
        assert node1.wait(20) == 1
        node0.send_signal(signal.SIGTERM)  # no grace: the test is the worst case of srun's timing
        assert node0.wait(20) in (1, 143)  # 1 when node 0 saw the abort before the signal came
    finally:
        _reap(procs)
    status = job.status()
    assert status["reason"].startswith("decode-0 (decode) on node 1 exited with code 3; last lines of ")
    assert "received SIGTERM" not in json.dumps(status)
    assert sorted(p.name for p in (job.run_dir / "state").glob("exit-node*.json")) == [
        "exit-node0.json",
        "exit-node1.json",
    ]
    job.assert_nothing_left()


@pytest.mark.parametrize("attempt", range(3))
def test_cause_beats_its_echo(make_job, attempt: int) -> None:
    # The client kills decode-0 (node 1) and fails at the same instant: node 0 sees its client
    # fail (the echo) while node 1 sees decode-0 die (the cause). Whichever node notices first,
    # the job's reason is the cause.
    job = make_job(flags={"bench": ["--kill-server", "decode-0", "--exit-code", "1"]})
    rc, _took = job.run()
    assert rc == 1, job.logs()
    status = job.status()
    assert status["reason"].startswith("decode-0 (decode) on node 1 was killed by signal 9"), status["reason"]
    assert status["failure"]["process"] == "decode-0" and status["failure"]["primary"] is True
    job.assert_nothing_left()


def test_echo_alone_is_the_reason(make_job) -> None:
    # With no cause anywhere else, the client's own failure is what the status says.
    job = make_job(timeouts={"settle_s": 30, "job_s": 50}, flags={"bench": ["--exit-code", "1"]})
    rc, took = job.run()
    assert rc == 1
    assert took < 25, job.logs()  # the head waited for node 1 to exit, not for the whole 30 s settle bound
    assert job.status()["failure"]["primary"] is False


# --- one node runtime, signalled -------------------------------------------------------


def test_sigterm_to_node_runtime(make_job) -> None:
    job = make_job(timeouts={"bench_s": 30}, flags={"bench": ["--sleep", "60"]})
    nodes = []
    for i in range(job.num_nodes):  # both node runtimes, as srun starts them, without a launcher
        with open(job.run_dir / f"node{i}.out", "wb") as out:
            nodes.append(
                subprocess.Popen(
                    ["bash", str(job.run_dir / "server.sh")],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=node_env(job.run_dir, "sigterm-test", i, job.num_nodes),
                    cwd=job.run_dir,
                    start_new_session=True,
                )
            )
    node = nodes[0]
    try:
        _wait_for(lambda: any(f["name"] == "bench" for f in job.fake_procs()), BENCH_START_S, "the bench to start")
        assert "every server and the proxy are ready" in job.log("node0")
        t0 = time.monotonic()
        node.send_signal(signal.SIGTERM)
        rc = node.wait(30)
        assert time.monotonic() - t0 < job.timeouts["teardown_s"] + 10
        assert nodes[1].wait(job.timeouts["teardown_s"] + 15) != 0  # node 1 follows the abort
    finally:
        for n in nodes:
            if n.poll() is None:
                os.killpg(n.pid, signal.SIGKILL)
                n.wait(5)
    assert rc == 143, job.logs()
    status = job.status()
    assert status["state"] == "failed" and status["exit_code"] == 143
    assert status["reason"] == "node 0: received SIGTERM (the local launcher recorded no reason)"
    assert json.loads((job.run_dir / "state" / "abort").read_text())["reason"] == status["reason"]
    assert {e["name"] for e in job.recorded_procs()} == {
        "prefill-0",
        "decode-0",
        "proxy",
        "bench",
        "power-node0",
        "power-node1",
    }
    job.assert_nothing_left()


@pytest.mark.parametrize("warned", ["every node", "node 0 only"])
def test_time_limit_warning_stops_the_job_as_timeout(make_job, warned: str) -> None:
    """Slurm's USR2 before the time limit (#SBATCH --signal=USR2@<s>), sent to every task:
    each node stops and tears down, the finished points are kept, the run is "timeout".
    Which node sees its warning first is a race; a node stopped by another node's warning
    (here made certain by warning node 0 only) exits as a timed-out node too."""
    job = make_job(timeouts={"bench_s": 30}, flags={"bench": ["--sleep", "60"]})
    nodes = []
    for i in range(job.num_nodes):
        with open(job.run_dir / f"node{i}.out", "wb") as out:
            nodes.append(
                subprocess.Popen(
                    ["bash", str(job.run_dir / "server.sh")],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=node_env(job.run_dir, "usr2-test", i, job.num_nodes),
                    cwd=job.run_dir,
                    start_new_session=True,
                )
            )
    try:
        _wait_for(lambda: any(f["name"] == "bench" for f in job.fake_procs()), BENCH_START_S, "the bench to start")
        for n in nodes if warned == "every node" else nodes[:1]:
            n.send_signal(signal.SIGUSR2)
        rcs = [n.wait(job.timeouts["teardown_s"] + 15) for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                os.killpg(n.pid, signal.SIGKILL)
                n.wait(5)
    assert rcs == [128 + signal.SIGUSR2] * 2, job.logs()
    status = job.status()
    assert status["state"] == "timeout", status
    first = "[01]" if warned == "every node" else "0"
    assert re.match(rf"node {first}: Slurm warned that the job's time limit is near", status["reason"]), status
    job.assert_nothing_left()


# --- coordination --------------------------------------------------------------------------


def test_abort_keeps_the_first_reason(tmp_path: Path) -> None:
    a, b = Coordination(tmp_path, 0, 2), Coordination(tmp_path, 1, 2)
    assert a.abort_reason() is None
    a.check_abort()  # nothing to raise yet
    b.abort("decode-0 exited with code 3")
    a.abort("not healthy within 10 s: decode-0")
    b.abort("a third reason")
    assert a.abort_reason() == b.abort_reason() == "node 1: decode-0 exited with code 3"
    with pytest.raises(Aborted, match=r"^node 1: decode-0 exited with code 3$"):
        a.check_abort()
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["abort", "root_cause"]  # no temp files


def test_first_primary_failure_wins_over_an_earlier_echo(tmp_path: Path) -> None:
    a, b = Coordination(tmp_path, 0, 2), Coordination(tmp_path, 1, 2)
    a.record_failure(Failure(0, "exited with code 1", process="bench", role="benchmark client", primary=False))
    assert a.first_failure().process == "bench" and a.root_cause() is None
    b.record_failure(
        Failure(
            1,
            "was killed by signal 9",
            process="decode-0",
            role="decode",
            log="logs/decode-0.log",
            log_tail="  last words",
        )
    )
    a.record_failure(Failure(0, "received SIGTERM"))  # later: kept out
    first = a.first_failure()
    assert (
        first.reason
        == "decode-0 (decode) on node 1 was killed by signal 9; last lines of logs/decode-0.log:\n  last words"
    )
    assert json.loads((tmp_path / "state" / "abort").read_text())["process"] == "bench"  # the stop signal
    t0 = time.monotonic()
    a.settle(10)  # a cause is recorded: nothing to wait for
    assert time.monotonic() - t0 < 5


def test_settle_is_bounded_and_ends_when_every_node_exited(tmp_path: Path) -> None:
    a, b = Coordination(tmp_path, 0, 2), Coordination(tmp_path, 1, 2)
    t0 = time.monotonic()
    a.settle(1.0, poll=0.05)
    assert 1.0 <= time.monotonic() - t0 < 5
    b.mark_exited(1)
    t0 = time.monotonic()
    a.settle(10, poll=0.05)
    assert time.monotonic() - t0 < 5


def test_concurrent_aborts_have_one_winner(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path; from harness.node.coordination import Coordination; "
        "Coordination(Path(sys.argv[1]), int(sys.argv[2]), 4).abort(f'reason {sys.argv[2]}')"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(i)]) for i in range(4)]
    assert [p.wait(20) for p in procs] == [0] * 4
    data = json.loads((tmp_path / "state" / "abort").read_text())
    assert data["reason"] == f"node {data['node']}: reason {data['node']}"
    cause = json.loads((tmp_path / "state" / "root_cause").read_text())  # one winner there too
    assert cause["reason"] == f"node {cause['node']}: reason {cause['node']}"
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["abort", "root_cause"]


def test_wait_for_nodes(tmp_path: Path) -> None:
    nodes = [Coordination(tmp_path, i, 4) for i in range(4)]
    nodes[0].announce("10.0.0.1")
    nodes[2].announce("10.0.0.3")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"nodes \[1, 3\] did not start within 1 s"):
        nodes[0].wait_for_nodes(0.6, poll=0.05)
    assert 0.6 <= time.monotonic() - t0 < 5
    nodes[1].announce("10.0.0.2")
    nodes[3].announce("10.0.0.4")
    assert nodes[3].wait_for_nodes(1) == {0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.3", 3: "10.0.0.4"}


def test_wait_for_nodes_stops_on_abort(tmp_path: Path, monkeypatch) -> None:
    a, b = Coordination(tmp_path, 0, 2), Coordination(tmp_path, 1, 2)
    a.announce("127.0.0.1")
    checks: list[bool] = []  # each of the wait's abort checks: did it find one?
    check_abort = a.check_abort

    def counted() -> None:
        if len(checks) == 2:  # node 1 gives up while node 0 is waiting for it
            b.abort("node 1 could not start")
        checks.append(a.has_failed())
        check_abort()

    monkeypatch.setattr(a, "check_abort", counted)
    t0 = time.monotonic()
    with pytest.raises(Aborted, match="node 1: node 1 could not start"):
        a.wait_for_nodes(10, poll=0.05)
    assert time.monotonic() - t0 < 5  # not the 10 s bound
    assert checks == [False, False, True]  # it was waiting, then stopped at the first check after


def test_done_marker(tmp_path: Path) -> None:
    a, b = Coordination(tmp_path, 0, 2), Coordination(tmp_path, 1, 2)
    assert not b.is_done()
    a.mark_done()
    assert b.is_done()
    assert json.loads((tmp_path / "state" / "done").read_text())["node"] == 0


def test_stale_host_heartbeat_tears_the_node_down(make_job, monkeypatch) -> None:
    # In a container, Slurm killing the task (past KillWait) leaves the container running:
    # the wrapper's heartbeat stops, and the node runtime inside ends the job by itself.
    job = make_job(flags={"bench": ["--sleep", "60"]})
    beat = job.run_dir / "state" / "heartbeat-node1"
    beat.parent.mkdir(exist_ok=True)
    beat.touch()
    old = time.time() - 120
    os.utime(beat, (old, old))
    monkeypatch.setenv("PDBENCH_HEARTBEAT", str(beat))  # both nodes watch node 1's stale file
    rc, took = job.run()
    assert rc == 1 and took < 20, job.logs()
    reason = job.status()["reason"]
    assert re.match(r"node [01]: the container's host-side wrapper stopped beating \d+ s ago", reason), reason
    job.assert_nothing_left()


def test_aggregated_baseline_runs_after_the_disaggregated_sweep(make_job) -> None:
    job = make_job(aggregated=True)
    rc, _took = job.run()
    assert rc == 0, job.logs()
    assert job.status()["results"] == sorted([AGGREGATED_RESULT_NAME, RESULT_NAME])
    node0 = job.log("node0")
    # The disaggregated servers and proxy were stopped before the baseline's started.
    stopped = node0.index("phase disagg done; stopping its processes")
    assert stopped < node0.index("started aggregated-0") < node0.index("started bench-aggregated")
    assert node0.count("smoke request through the proxy answered") == 2
    assert (job.run_dir / "state" / "done-disagg").is_file() and (job.run_dir / "state" / "done").is_file()
    # Node 1 has no baseline server: it moved on with node 0 and waited for the job's end.
    assert "node 1: phase aggregated" in job.log("node1") and "node 1 finished" in job.log("node1")
    recorded = [e["name"] for e in job.recorded_procs()]
    assert sorted(recorded) == sorted(
        [
            "prefill-0",
            "proxy",
            "bench",
            "aggregated-0",
            "aggregated-1",
            "proxy-aggregated",
            "bench-aggregated",
            "decode-0",
            "power-node0",  # the disaggregated phase's sampler and the baseline's, on node 0
            "power-node0",
            "power-node1",
        ]
    )
    for name in ("aggregated-0", "aggregated-1"):
        assert (job.run_dir / "metrics" / "aggregated" / f"{name}.after.prom").is_file()
    job.assert_nothing_left()


def test_a_failed_disaggregated_sweep_still_runs_its_baseline_and_fails_the_job(make_job) -> None:
    # A sweep with a failed or invalid point (a degraded KV transport, say) says nothing against the
    # aggregated baseline: it runs on the same GPUs, and the job fails at its end, naming the sweep.
    job = make_job(aggregated=True, flags={"bench": ["--exit-code", "1"]})
    rc, _took = job.run()
    assert rc != 0, job.logs()
    node0 = job.log("node0")
    assert "phase disagg failed" in node0 and "started bench-aggregated" in node0, node0
    assert (job.run_dir / AGGREGATED_RESULT_NAME).is_file() and (job.run_dir / RESULT_NAME).is_file()
    status = job.status()
    assert status["state"] == "failed" and status["failure"]["process"] == "bench", status
    assert "bench (benchmark client) on node 0 exited with code 1" in status["reason"], status["reason"]
    job.assert_nothing_left()


def test_aggregated_only_job_runs_just_the_aggregated_servers(make_job) -> None:
    job = make_job(aggregated=True, aggregated_only=True)
    rc, _took = job.run()
    assert rc == 0, job.logs()
    assert job.status()["results"] == [AGGREGATED_RESULT_NAME]
    assert sorted(e["name"] for e in job.recorded_procs()) == [
        "aggregated-0",
        "aggregated-1",
        "bench-aggregated",
        "power-node0",
        "proxy-aggregated",
    ]
    assert not (job.run_dir / "bench.json").exists() and (job.run_dir / "bench-aggregated.json").is_file()
    job.assert_nothing_left()


def test_an_invalid_repeat_of_an_slo_search_fails_the_job(make_job) -> None:
    """An SLO search measures its best points again under repeats/<k>/: a repeat judged invalid
    fails the job as an invalid top-level point does, named by its path in the run."""
    job = make_job()
    repeat = job.run_dir / "repeats" / "2" / RESULT_NAME
    repeat.parent.mkdir(parents=True)
    validity = {"verdict": "invalid", "reasons": ["no KV transfer seen on decode-0"]}
    repeat.write_text(json.dumps({"completed": 1, "metadata": {"valid": False, "validity": validity}}))
    unverified = job.run_dir / "repeats" / "1" / RESULT_NAME
    unverified.parent.mkdir(parents=True)
    unverified.write_text(
        json.dumps({"completed": 1, "metadata": {"valid": None, "validity": {"verdict": "unverified"}}})
    )
    rc, _took = job.run()
    assert rc != 0, job.logs()
    status = job.status()
    # The sweep's own point is there and not judged invalid (the fake bench writes no verdict).
    assert status["results"] == [RESULT_NAME] and "metadata" not in json.loads((job.run_dir / RESULT_NAME).read_text())
    assert status["state"] == "failed"
    assert (
        status["reason"] == f"node 0: invalid result point(s): repeats/2/{RESULT_NAME}: no KV transfer seen on decode-0"
    )
    assert f"without validity evidence (no server /metrics): repeats/1/{RESULT_NAME}" in job.log("node0")
    job.assert_nothing_left()


# --- GPU power: the sampler on every node, node 0's accounting ---------------------------------


def _telemetry_here() -> str | None:
    found = [n for n in ("nvidia-smi", "amd-smi") if shutil.which(n)]
    if importlib.util.find_spec("pynvml") is not None:
        found.append("pynvml")
    return ", ".join(found) or None


def test_without_gpu_telemetry_power_is_recorded_missing_and_the_job_unaffected(make_job) -> None:
    if found := _telemetry_here():
        pytest.skip(f"this machine has GPU telemetry ({found}); the missing path needs one without")
    job = make_job()
    rc, _took = job.run()
    assert rc == 0 and job.status()["state"] == "succeeded", job.logs()
    for node in (0, 1):
        rec = read_record(job.run_dir / "power" / "raw" / f"node{node}.json")
        assert rec is not None and rec.status == "missing" and "nvidia-smi is not on PATH" in rec.reason, rec
    point = json.loads((job.run_dir / "power" / "points" / RESULT_NAME).read_text())
    assert point["power_valid"] is None and point["total"] is None and point["roles"] == {}, point
    assert point["missing"].startswith("node 0 (prefill-0): telemetry missing: nvml: pynvml is not importable")
    assert not (job.run_dir / "power" / "disagg").exists()  # no package without samples
    assert f"power {RESULT_NAME}: missing: " in job.log("node0")
    job.assert_nothing_left()


def test_a_recipe_that_requires_power_fails_the_job_without_it(make_job) -> None:
    if found := _telemetry_here():
        pytest.skip(f"this machine has GPU telemetry ({found}); the missing path needs one without")
    job = make_job(overrides=("benchmark.validity.require_power=true",))
    rc, _took = job.run()
    assert rc != 0, job.logs()
    status = job.status()
    assert status["state"] == "failed" and status["results"] == [RESULT_NAME], status  # the point is kept
    assert status["reason"].startswith(
        "node 0: GPU power is required (benchmark.validity.require_power): "
        f"{RESULT_NAME}: missing (node 0 (prefill-0): telemetry missing: nvml: pynvml is not importable"
    ), status["reason"]
    point = json.loads((job.run_dir / "power" / "points" / RESULT_NAME).read_text())
    assert point["power_valid"] is None  # recorded as missing, as without the requirement
    job.assert_nothing_left()


def test_power_sampling_can_be_turned_off(make_job) -> None:
    job = make_job(overrides=("benchmark.validity.power_interval_s=0",))
    rc, _took = job.run()
    assert rc == 0, job.logs()
    assert not any(e["name"].startswith("power-") for e in job.recorded_procs())  # no sampler started
    assert not (job.run_dir / "power" / "raw").exists()
    point = json.loads((job.run_dir / "power" / "points" / RESULT_NAME).read_text())
    assert point["power_valid"] is None
    assert point["missing"] == "GPU power sampling is off (benchmark.validity.power_interval_s: 0)"
    job.assert_nothing_left()


def test_power_is_sampled_on_every_node_and_accounted_per_role(make_job, tmp_path: Path, monkeypatch) -> None:
    if importlib.util.find_spec("pynvml") is not None:
        pytest.skip("pynvml is importable here: the sampler would read NVML, not the nvidia-smi double")
    smi = fake_bin(tmp_path / "smi", "nvidia-smi", FAKE_NVIDIA_SMI)
    monkeypatch.setenv("PATH", f"{smi}{os.pathsep}{os.environ['PATH']}")
    job = make_job()
    rc, _took = job.run()
    assert rc == 0, job.logs()
    for node in (0, 1):
        rec = read_record(job.run_dir / "power" / "raw" / f"node{node}.json")
        assert rec is not None and rec.status == "sampling" and rec.backend == "nvidia-smi", rec
        assert rec.phase == "disagg" and rec.interval_s == 0.25
    point = json.loads((job.run_dir / "power" / "points" / RESULT_NAME).read_text())
    assert point["power_valid"] is True, (point["reasons"], job.log("node0")[-3000:])
    result = json.loads((job.run_dir / RESULT_NAME).read_text())
    assert (point["start_unix"], point["end_unix"]) == (
        result["benchmark_start_time_unix"],
        result["benchmark_end_time_unix"],
    )
    # Each one-node server owns its node's GPUs: both doubles' GPUs, 100.5 W and 200.25 W.
    for role, server in (("prefill", "prefill-0"), ("decode", "decode-0")):
        grp = point["roles"][role]
        assert grp["gpus"] == 2 and grp["mean_w"] == pytest.approx((100.5 + 200.25) / 2), grp
        assert grp["energy_j"] == pytest.approx(300.75 * point["duration_s"]) and grp["peak_w"] == 200.25
        assert point["servers"][server]["energy_j"] == grp["energy_j"]  # one server a role
    assert point["roles"]["prefill"]["j_per_input_token"] == pytest.approx(point["roles"]["prefill"]["energy_j"] / 1)
    assert point["roles"]["decode"]["j_per_output_token"] == pytest.approx(point["roles"]["decode"]["energy_j"] / 4)
    manifest = json.loads((job.run_dir / "power" / "disagg" / "manifest.json").read_text())
    assert [d["gpu_index"] for d in manifest["expected_devices"]] == [0, 1, 0, 1]
    assert [v["power_coverage_valid"] for v in manifest["window_validations"]] == [True]
    # The local launcher's two nodes are one host: both sample the same GPUs (the same UUIDs),
    # which the package does not publish as four GPUs.
    assert {tuple(d["gpu_uuids"]) for d in manifest["observed_devices"]} == {("GPU-aaaa",), ("GPU-bbbb",)}
    assert manifest["publication_valid"] is False
    assert (job.run_dir / "power" / "disagg" / "windows" / RESULT_NAME).is_file()
    job.assert_nothing_left()


def test_supervisor_stop_of_one_process_leaves_the_others_descendants(tmp_path: Path) -> None:
    """A router arm's turn stops the router before it alone: the servers' children (vLLM's engine
    cores) are descendants the supervisor has seen too, and must keep running."""
    sup = Supervisor(tmp_path / "logs")
    child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print('up', flush=True); time.sleep(60)"
    a = sup.start("server", [sys.executable, "-c", child], os.environ)
    b = sup.start("proxy", [sys.executable, "-c", child], os.environ)
    try:
        _wait_for(lambda: "up" in a.log_path.read_text() and "up" in b.log_path.read_text(), 20, "both to start")
        sup.refresh()  # both children seen, as the node's checks see them
        kids = {m.name: psutil.Process(m.pid).children() for m in (a, b)}
        assert all(len(k) == 1 for k in kids.values()), kids
        sup.stop("proxy", 2)
        assert b.popen.poll() is not None and not kids["proxy"][0].is_running()
        assert a.popen.poll() is None and kids["server"][0].is_running()  # the precondition of the next arm
    finally:
        sup.stop_all(2)
    assert not kids["server"][0].is_running()


WORKLOADS = ("benchmark.workloads={long-prompts: {isl: 64}, short: {osl: 8}}",)


def test_workloads_measure_the_same_servers_one_client_after_the_other(make_job) -> None:
    job = make_job(overrides=WORKLOADS)
    rc, _took = job.run()
    assert rc == 0, job.logs()
    # The job's own point is the run's result; each workload's is under workloads/<name>/.
    assert job.status()["results"] == [RESULT_NAME]
    for name in ("long-prompts", "short"):
        later = json.loads((job.run_dir / "workloads" / name / RESULT_NAME).read_text())
        assert later["text"] == " fake from proxy"  # through the job's one router
        for server in ("prefill-0", "decode-0"):  # the workload's own /metrics around its sweep
            for when in ("before", "after"):
                assert (job.run_dir / "workloads" / name / "metrics" / f"{server}.{when}.prom").is_file()
    node0 = job.log("node0")
    # The servers and the router stayed up: started once, the clients one after the other in order.
    assert node0.count("started prefill-0") == 1 and node0.count("started proxy") == 1
    assert "stopped proxy " not in node0.split("started bench-workload-short")[0]
    order = ["started bench", "started bench-workload-long-prompts", "started bench-workload-short"]
    at = [node0.find(x) for x in order]
    assert -1 not in at and at == sorted(at), (at, node0)
    recorded = [e["name"] for e in job.recorded_procs()]
    assert {"proxy", "bench", "bench-workload-long-prompts", "bench-workload-short"} <= set(recorded)
    job.assert_nothing_left()


def test_a_failing_workload_client_fails_the_job_and_later_ones_do_not_run(make_job) -> None:
    job = make_job(overrides=WORKLOADS, flags={"bench-workload-long-prompts": ["--exit-code", "1"]})
    rc, _took = job.run()
    assert rc != 0
    status = job.status()
    assert status["state"] == "failed"
    assert status["failure"]["process"] == "bench-workload-long-prompts", status
    assert "started bench-workload-short" not in job.log("node0")
    job.assert_nothing_left()


def test_router_arms_measure_the_same_servers_one_router_after_the_other(make_job) -> None:
    (metrics_port,) = free_ports(1)
    arms = ("proxy.arms=[pdbench, vllm-router]", f"proxy.metrics_port={metrics_port}")
    job = make_job(overrides=arms)
    rc, _took = job.run()
    assert rc == 0, job.logs()
    # The job's own router's point is the run's result; the later arm's is under arms/<arm>/.
    assert job.status()["results"] == [RESULT_NAME]
    later = json.loads((job.run_dir / "arms" / "vllm-router" / RESULT_NAME).read_text())
    assert later["text"] == " fake from proxy"  # through the router on the proxy's port
    node0 = job.log("node0")
    # The servers stayed up: started once; the job's router stopped before the arm's started.
    assert node0.count("started prefill-0") == 1
    order = [
        "started bench",
        "router arm vllm-router: stopping proxy, starting proxy-arm-vllm-router",
        "stopped proxy ",
        "started proxy-arm-vllm-router",
        "router arm vllm-router: smoke request answered",
        "started bench-arm-vllm-router",
    ]
    at = [node0.find(x) for x in order]
    assert -1 not in at and at == sorted(at), (at, node0)
    for name in ("prefill-0", "decode-0"):  # the arm's own /metrics around its sweep
        assert (job.run_dir / "arms" / "vllm-router" / "metrics" / f"{name}.after.prom").is_file()
    recorded = [e["name"] for e in job.recorded_procs()]
    assert {"proxy", "bench", "proxy-arm-vllm-router", "bench-arm-vllm-router"} <= set(recorded)
    job.assert_nothing_left()
