"""The same-job KV ceiling on CPU: the node finds prefill-0's and decode-0's processes in their
nodes' records, measures in prefill-0's interpreter (a host copy here: no CUDA), bounded in time,
and writes state/kv_ceiling.json; what cannot be measured is recorded as missing, with why."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from harness import atomic
from harness.config import load_recipe
from harness.node import kv_ceiling, kv_ceiling_probe
from harness.rundir import RunDir
from harness.rundir.kv_ceiling import read
from harness.topology import PlanFile, plan

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20
SIZE = 64 * MIB  # past the caches of a CI machine, small enough for its memory


def own_memcpy_gbps(nbytes: int, repeats: int = 5) -> float:
    """This machine's host copy rate, measured here with numpy (not the probe's code): the median."""
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / float(np.median(times)) / 1e9


@pytest.fixture(scope="module")
def job_plan() -> PlanFile:
    rr = load_recipe(
        "tiny-fp32-cpu-nixl-1p1d"
    )  # prefill-0 on node 0, decode-0 on node 1 (the local launcher: one host)
    return PlanFile.of(rr, plan(rr))


@pytest.fixture()
def servers(tmp_path: Path, job_plan: PlanFile) -> Iterator[Path]:
    """A run directory whose two nodes recorded a "server" each: python processes of this
    interpreter, without CUDA_VISIBLE_DEVICES, as CPU vLLM servers run."""
    run = RunDir(tmp_path)
    run.state.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    procs = []
    try:
        for w in job_plan.workers:
            p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=env)
            procs.append(p)
            atomic.write_json(run.proc_record(w.node), [{"name": w.name, "pid": p.pid, "create_time": 0}])
        yield tmp_path
    finally:
        for p in procs:
            p.communicate(timeout=10)  # closing its stdin ends it


def test_the_probe_copies_host_memory_when_no_gpu_is_named() -> None:
    out = kv_ceiling_probe.measure(None, None, 1 << 30, SIZE, 3)
    assert out["method"] == "host_memcpy" and out["bytes"] == SIZE and out["repeats"] == 3
    assert len(out["seconds"]) == 3 and all(s > 0 for s in out["seconds"])
    assert out["src_device"].startswith("host")


def test_without_gpu_device_nodes_the_probe_copies_host_memory_without_importing_torch() -> None:
    # The precondition: this host has no GPU device node (a CPU CI machine); torch is importable.
    if any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd")):
        pytest.skip("this host has GPU device nodes")
    code = (
        "import json, sys; from harness.node import kv_ceiling_probe as k; "
        f"out = k.measure(0, 0, 1 << 20, {SIZE}, 2); "
        "import importlib.util; assert importlib.util.find_spec('torch'); "
        "print(json.dumps([out['method'], out['reason'], 'torch' in sys.modules]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    method, reason, torch_imported = json.loads(r.stdout)
    assert method == "host_memcpy" and "no GPU device node" in reason and torch_imported is False


def test_the_node_measures_the_host_ceiling_in_prefills_interpreter(servers: Path, job_plan: PlanFile) -> None:
    addrs = {0: "127.0.0.1", 1: "127.0.0.1"}
    written = kv_ceiling.record(servers, job_plan, 0, addrs)
    ceiling = read(RunDir(servers).kv_ceiling)
    assert ceiling == written and ceiling is not None
    assert ceiling.status == "measured", ceiling.reason
    assert ceiling.method == "host_memcpy" and ceiling.servers == ["prefill-0", "decode-0"] and ceiling.node == 0
    assert ceiling.bytes == kv_ceiling.HOST_BYTES and len(ceiling.seconds) == kv_ceiling.REPEATS
    assert ceiling.took_s is not None and 0 < ceiling.took_s < kv_ceiling.TIMEOUT_S
    # Two-sided sanity: within a factor of this machine's own copy rate, measured here beside it.
    own = own_memcpy_gbps(kv_ceiling.HOST_BYTES)
    assert ceiling.gbps is not None and own / 5 < ceiling.gbps < own * 5, (ceiling.gbps, own)
    assert ceiling.best_gbps is not None and ceiling.best_gbps >= ceiling.gbps
    assert "host_memcpy" in ceiling.describe() and "median of 5" in ceiling.describe()


def test_what_cannot_be_measured_is_recorded_as_missing_with_why(
    servers: Path, job_plan: PlanFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another host: no copy here, a transfer to decode-0's node (tests/node/test_kv_ceiling_hosts.py),
    # whose node did not listen here.
    monkeypatch.setattr(kv_ceiling, "SINK_WAIT_S", 0.2)
    c = kv_ceiling.measure(servers, job_plan, 0, {0: "10.0.0.1", 1: "10.0.0.2"})
    assert c.status == "missing" and c.gbps is None and c.method == "tcp_stream"
    assert "decode-0's node 1 did not listen for the transfer within 0.2 s" in c.reason
    # A measurement past its bound is stopped and said so.
    c = kv_ceiling.measure(servers, job_plan, 0, {0: "h", 1: "h"}, timeout=0.01)
    assert c.status == "missing" and "did not end within 0.01 s" in c.reason
    # No recorded process: the node's own interpreter copies host memory instead, and says so.
    RunDir(servers).proc_record(0).unlink()
    c = kv_ceiling.measure(servers, job_plan, 0, {0: "h", 1: "h"}, host_bytes=SIZE, repeats=2)
    assert c.status == "measured" and c.method == "host_memcpy" and c.bytes == SIZE
    # A plan without decode: nothing is transferred.
    alone = job_plan.model_copy(update={"workers": job_plan.workers[:1]})
    assert "no prefill-0 and decode-0" in kv_ceiling.measure(servers, alone, 0, {0: "h"}).reason


def test_a_record_that_does_not_read_is_a_missing_ceiling_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kv_ceiling.json"
    assert read(path) is None  # not a pdbench job: no record at all
    path.write_text('{"status": "measured", "bytes": -1}')
    c = read(path)
    assert c is not None and c.status == "missing" and str(path) in c.reason and c.gbps is None


def test_each_servers_gpu_is_the_first_of_its_visible_devices(job_plan: PlanFile) -> None:
    w = job_plan.workers[0]
    assert kv_ceiling.first_gpu({"CUDA_VISIBLE_DEVICES": "1,0"}, w) == 1
    assert kv_ceiling.first_gpu({}, dataclasses.replace(w, visible_devices="2,3")) == 2
    assert kv_ceiling.first_gpu({}, w) == 0
    assert kv_ceiling.first_gpu({"CUDA_VISIBLE_DEVICES": "GPU-5d2c"}, w) is None
