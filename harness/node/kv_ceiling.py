"""The same-job KV ceiling, measured on the node before the sweep (the record: harness.rundir.kv_ceiling;
the measurement: harness.node.kv_ceiling_probe; the verdict that reads it: harness.validity.kv_transport).

It runs on the head node once every server is healthy and before the sweep's first /metrics
baseline, so nothing else moves data then, when prefill-0 and decode-0 run on its host (their
nodes' addresses are its own: one Slurm node, or the local launcher's nodes); in prefill-0's own
interpreter and environment (its torch, its GPUs), as a subprocess bounded by TIMEOUT_S, so its
CUDA context ends with it.
The GPUs are each server's first of its CUDA_VISIBLE_DEVICES (vLLM's device 0 of the list), and
the probe runs with CUDA_VISIBLE_DEVICES unset, so it addresses them by their physical index.
When they run on different hosts, the ceiling is the NIC's line rate (harness.node.link_rate) and a
TCP transfer measured from this node to decode-0's (harness.node.kv_stream): decode-0's node
listens (`sink`, around its wait for the job's end) and this node sends, when it runs prefill-0.
Whatever cannot be had is recorded as missing, with the reason; the measurement never fails the job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from harness import atomic
from harness.node import kv_ceiling_probe, kv_stream, link_rate
from harness.node.versions import Interpreter, server_interpreter
from harness.rundir import RunDir
from harness.rundir.kv_ceiling import KvCeiling, missing
from harness.supervisor import recorded_processes
from harness.topology import PlanFile, Worker

log = logging.getLogger(__name__)

# Interpreter start and torch's import take most of it; 5 copies of 1 GiB on an H200 took 0.5 ms
# each (on one GPU) and 2.7 ms (GPU to GPU over NVLink).
TIMEOUT_S = 90.0
GPU_BYTES = 1 << 30  # one 8B-Llama transfer of 8k tokens; large enough to be bandwidth-bound
HOST_BYTES = 256 << 20  # past any cache, small enough for a CPU CI node's memory
REPEATS = 5
# Across hosts: 256 MiB is 0.2 s at 10 Gb/s, 2 s at 1 Gb/s; the wait for decode-0's node to listen
# (it starts once its own servers are healthy, before node 0's health gate passes) is a bounded part.
STREAM_BYTES = 256 << 20
SINK_WAIT_S = 20.0


def first_gpu(env: Mapping[str, str], worker: Worker) -> int | None:
    """The physical GPU a server's vLLM takes: the first of its CUDA_VISIBLE_DEVICES (the server's
    own environment, then the plan's), GPU 0 when neither sets it; None when it is no index (a UUID)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", worker.visible_devices or "0")
    first = visible.split(",")[0].strip()
    return int(first) if first.isdigit() else None


def _server_pid(run: RunDir, name: str, node: int) -> int | None:
    """A server's pid from its node's process record (state/procs-node<N>.json, the supervisor's)."""
    procs = recorded_processes(run.proc_record(node))
    pid = next((p.get("pid") for p in procs if p.get("name") == name), None)
    return pid if isinstance(pid, int) else None


def measure(
    run_dir: Path, plan: PlanFile, node: int, addrs: Mapping[int, str], timeout: float = TIMEOUT_S, **sizes: int
) -> KvCeiling:
    """The ceiling between prefill-0's and decode-0's devices: a copy here when both run on this
    host (`addrs`: each node's address; the local launcher's nodes share one), else a transfer to
    decode-0's node (across_hosts). Their processes are found in their nodes' records. `sizes`:
    gpu_bytes, host_bytes, stream_bytes, repeats."""
    workers = {w.name: w for w in plan.workers}
    prefill, decode = workers.get("prefill-0"), workers.get("decode-0")
    if prefill is None or decode is None:
        return missing("no prefill-0 and decode-0 in the plan: nothing is transferred")
    names = [prefill.name, decode.name]
    here = addrs.get(node)
    if addrs.get(prefill.node) != here or addrs.get(decode.node) != here:
        return across_hosts(run_dir, prefill, decode, node, addrs, timeout, **sizes)
    run = RunDir(run_dir)
    found = {w.name: _server_pid(run, w.name, w.node) for w in (prefill, decode)}
    procs = {name: server_interpreter(pid) if pid else f"no process of {name} recorded" for name, pid in found.items()}
    interp, decode_proc = procs[prefill.name], procs[decode.name]
    decode_env: Mapping[str, str] = decode_proc.env if isinstance(decode_proc, Interpreter) else {}
    if isinstance(interp, Interpreter):
        python, env = interp.python, dict(interp.env)
        src, dst = first_gpu(env, prefill), first_gpu(decode_env, decode)
        how = f"prefill-0's interpreter {python}"
    else:  # a host copy in this node's own interpreter
        python, env, src, dst = sys.executable, dict(os.environ), None, None
        how = f"this node's interpreter ({interp})"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    gpu_bytes = sizes.get("gpu_bytes", GPU_BYTES)
    host_bytes = sizes.get("host_bytes", HOST_BYTES)
    repeats = sizes.get("repeats", REPEATS)
    argv = [str(v) for v in ("-" if src is None else src, "-" if dst is None else dst, gpu_bytes, host_bytes, repeats)]
    source = Path(kv_ceiling_probe.__file__).read_text()
    t0 = time.monotonic()
    common = {"node": node, "servers": names}
    try:
        r = subprocess.run(
            [python, "-c", source, *argv],
            env=env,
            cwd="/",  # nothing of the run directory on sys.path
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return missing(f"the measurement in {how} did not end within {timeout:g} s", **common)
    except OSError as e:
        return missing(f"cannot run {how}: {e}", **common)
    took = time.monotonic() - t0
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return missing(f"the measurement in {how} exited with {r.returncode}: {last}", **common)
    try:
        fields = json.loads(r.stdout)
        return KvCeiling.model_validate({"status": "measured", **fields, **common, "took_s": took})
    except ValueError as e:  # pydantic's ValidationError is one
        return missing(f"the measurement in {how} printed no record ({e}): {r.stdout[:200]!r}", **common)


def across_hosts(
    run_dir: Path, prefill: Worker, decode: Worker, node: int, addrs: Mapping[int, str], timeout: float, **sizes: int
) -> KvCeiling:
    """The ceiling between prefill-0's node (this one) and decode-0's: a measured TCP transfer to
    decode-0's node's sink, bounded by the line rate of the interface it left by."""
    src = addrs.get(prefill.node)
    common = {"node": node, "servers": [prefill.name, decode.name], "method": "tcp_stream"}
    if src != addrs.get(node):
        return missing(
            f"prefill-0 runs on node {prefill.node} ({src}), not on node {node} which measures: the "
            "transfer from prefill-0's host is not built",
            **common,
        )
    nbytes = sizes.get("stream_bytes", STREAM_BYTES)
    repeats = sizes.get("repeats", REPEATS)
    t0 = time.monotonic()
    run = RunDir(run_dir)
    sink = _wait_for_sink(run.kv_sink, decode.node, min(SINK_WAIT_S, timeout))
    if isinstance(sink, str):
        return missing(sink, **common)
    try:
        seconds, local = kv_stream.send(
            sink[0], sink[1], kv_stream.secret_digest(run.secret), nbytes, repeats, timeout - (time.monotonic() - t0)
        )
    except (OSError, ValueError) as e:  # ConnectionError and TimeoutError are OSErrors
        return missing(f"the transfer to decode-0's node {decode.node} ({sink[0]}:{sink[1]}) failed: {e}", **common)
    took = time.monotonic() - t0
    # RDMA ports the NIC detection gave prefill-0's UCX carry the KV; else the transfer's interface.
    pid = _server_pid(run, prefill.name, prefill.node)
    interp = server_interpreter(pid) if pid else None
    env = interp.env if isinstance(interp, Interpreter) else {}
    rate = link_rate.rdma_line_rate(env.get("UCX_NET_DEVICES")) or link_rate.line_rate(link_rate.interface_of(local))
    return KvCeiling.model_validate(
        {
            "status": "measured",
            **common,
            "src_device": f"node {node} {local}",
            "dst_device": f"node {decode.node} {sink[0]}",
            "interface": rate.interface,
            "line_rate_gbps": rate.gbps,
            "line_rate_note": rate.note,
            "bytes": nbytes,
            "repeats": repeats,
            "seconds": seconds,
            "took_s": took,
        }
    )


def _wait_for_sink(path: Path, node: int, timeout: float) -> tuple[str, int] | str:
    """decode-0's node's sink (address, port) from its record; why not, as a str, past `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            rec = json.loads(path.read_text())
            if rec.get("node") != node:
                return f"{path} is node {rec.get('node')}'s sink, not decode-0's node {node}'s"
            if rec.get("error"):
                return f"decode-0's node {node} could not listen for the transfer: {rec['error']}"
            return str(rec["addr"]), int(rec["port"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"{path} does not read as a sink record: {e}"
        if time.monotonic() > deadline:
            return f"decode-0's node {node} did not listen for the transfer within {timeout:g} s (no {path.name})"
        time.sleep(0.1)


@contextlib.contextmanager
def sink(run_dir: Path, plan: PlanFile, node: int, addrs: Mapping[int, str]) -> Iterator[None]:
    """What this node runs while it waits for the job's end: on decode-0's node, when prefill-0 runs
    on another host, the listening end of node 0's measured transfer; elsewhere nothing. A sink that
    cannot listen records why (node 0's ceiling then says so) and the job goes on."""
    workers = {w.name: w for w in plan.workers}
    prefill, decode = workers.get("prefill-0"), workers.get("decode-0")
    run = RunDir(run_dir)
    with contextlib.ExitStack() as stack:
        if prefill is not None and decode is not None and decode.node == node and addrs[prefill.node] != addrs[node]:
            try:
                stack.enter_context(kv_stream.Sink(addrs[node], node, kv_stream.secret_digest(run.secret), run.kv_sink))
                log.info("listening for the KV ceiling's transfer from node %d", prefill.node)
            except OSError as e:
                log.warning("cannot listen for the KV ceiling's transfer: %s", e)
                atomic.write_json(run.kv_sink, {"node": node, "error": str(e)})
        yield


def record(run_dir: Path, plan: PlanFile, node: int, addrs: Mapping[int, str]) -> KvCeiling:
    """Measures and writes state/kv_ceiling.json; returns what it wrote."""
    ceiling = measure(run_dir, plan, node, addrs)
    atomic.write_text(RunDir(run_dir).kv_ceiling, ceiling.model_dump_json(indent=2))
    log.info("KV ceiling: %s", ceiling.describe())
    return ceiling
