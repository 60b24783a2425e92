"""The KV ceiling across hosts: decode-0's node listens, node 0 sends a bounded TCP transfer and
reads the line rate of the interface it left by from sysfs; the record keeps both with their
conditions, and the verdict judges against it as against a copy on one host. Two hosts are two
loopback addresses here (127.0.0.1 and 127.0.0.2: the kernel routes all of 127/8 over lo)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import atomic
from harness.config import load_recipe
from harness.config.benchmark import ValidityThresholds
from harness.node import kv_ceiling, kv_stream, link_rate
from harness.node.secrets import ensure_job_secret
from harness.rundir import RunDir
from harness.rundir.kv_ceiling import KvCeiling, read
from harness.rundir.kv_handoff_summary import KvHandoffSummary
from harness.topology import PlanFile, plan
from harness.validity.kv_transport import judge

pytestmark = pytest.mark.timeout(60)
MIB = 1 << 20
HOSTS = {0: "127.0.0.1", 1: "127.0.0.2"}  # prefill-0 on node 0, decode-0 on node 1


@pytest.fixture(scope="module")
def job_plan() -> PlanFile:
    rr = load_recipe("tiny-fp32-cpu-nixl-1p1d")  # prefill-0 on node 0, decode-0 on node 1
    return PlanFile.of(rr, plan(rr))


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    ensure_job_secret(tmp_path)  # every node does before its servers start
    return tmp_path


@pytest.fixture()
def sink(run_dir: Path) -> Iterator[kv_stream.Sink]:
    """decode-0's node's sink, as kv_ceiling.sink starts it."""
    run = RunDir(run_dir)
    with kv_stream.Sink(HOSTS[1], 1, kv_stream.secret_digest(run.secret), run.kv_sink) as s:
        yield s
    assert not s.alive and not run.kv_sink.exists()  # joined, and its record gone


# --------------------------------------------------------------------------- the line rate


def _iface(sysfs: Path, name: str, speed: str | None, device: bool, address: str = "52:54:00:12:34:56") -> None:
    d = sysfs / "class" / "net" / name
    d.mkdir(parents=True)
    (d / "address").write_text(address + "\n")
    if speed is not None:
        (d / "speed").write_text(speed + "\n")
    if device:
        (d / "device").mkdir()


def test_the_line_rate_is_a_devices_speed_and_nothing_else_is(tmp_path: Path) -> None:
    mac = "52:54:00:12:34:56"
    _iface(tmp_path, "ens1f0", "100000", device=True)
    r = link_rate.line_rate("ens1f0", tmp_path, hwaddr=mac)
    assert r.gbps == pytest.approx(12.5) and r.note == "100000 Mb/s" and r.interface == "ens1f0"
    # virtio's driver does not know its speed: -1
    _iface(tmp_path, "eth0", "-1", device=True)
    r = link_rate.line_rate("eth0", tmp_path, hwaddr=mac)
    assert r.gbps is None and "speed is unknown (-1)" in r.note
    # a veth says 10000 whatever it moves
    _iface(tmp_path, "veth0", "10000", device=False)
    r = link_rate.line_rate("veth0", tmp_path, hwaddr=mac)
    assert r.gbps is None and "virtual interface" in r.note and "10000 Mb/s is nominal" in r.note
    # lo: no speed at all (EINVAL on a real sysfs)
    _iface(tmp_path, "lo", None, device=False, address="00:00:00:00:00:00")
    r = link_rate.line_rate("lo", tmp_path, hwaddr="00:00:00:00:00:00")
    assert r.gbps is None and "no speed in sysfs" in r.note
    # a bond has no device but a real speed: its links' sum
    _iface(tmp_path, "bond0", "200000", device=False)
    (tmp_path / "class" / "net" / "bond0" / "bonding").mkdir()
    assert link_rate.line_rate("bond0", tmp_path, hwaddr=mac).gbps == pytest.approx(25.0)
    # sysfs mounted in another network namespace shows its own eth0 under the same name
    r = link_rate.line_rate("ens1f0", tmp_path, hwaddr="aa:bb:cc:dd:ee:ff")
    assert r.gbps is None and "another network namespace's ens1f0" in r.note and mac in r.note
    assert link_rate.line_rate("ib9", tmp_path, hwaddr=mac).gbps is None
    assert link_rate.line_rate(None, tmp_path).note.startswith("no interface of this node holds")


def _rdma_port(sysfs: Path, dev: str, port: int, rate: str) -> None:
    d = sysfs / "class" / "infiniband" / dev / "ports" / str(port)
    d.mkdir(parents=True)
    (d / "rate").write_text(rate + "\n")


def test_the_rdma_ports_ucx_was_given_are_the_line_rate(tmp_path: Path) -> None:
    _rdma_port(tmp_path, "mlx5_0", 1, "400 Gb/sec (4X NDR)")
    _rdma_port(tmp_path, "mlx5_1", 1, "200 Gb/sec (4X HDR)")
    r = link_rate.rdma_line_rate("mlx5_0:1,mlx5_1:1", tmp_path)
    assert r is not None and r.gbps == pytest.approx(75.0) and r.interface == "mlx5_0:1,mlx5_1:1"
    assert r.note == "UCX_NET_DEVICES of prefill-0: mlx5_0:1 400 Gb/sec (4X NDR), mlx5_1:1 200 Gb/sec (4X HDR)"
    r = link_rate.rdma_line_rate("mlx5_0:1", tmp_path)
    assert r is not None and r.gbps == pytest.approx(50.0)
    # TCP (an interface name), unset, or a device not on this node: not RDMA, the route's interface counts
    assert link_rate.rdma_line_rate("eth0", tmp_path) is None and link_rate.rdma_line_rate(None, tmp_path) is None
    assert link_rate.rdma_line_rate("mlx5_7:1", tmp_path) is None
    _rdma_port(tmp_path, "mlx5_2", 1, "garbage")
    r = link_rate.rdma_line_rate("mlx5_2:1", tmp_path)
    assert r is not None and r.gbps is None and "not a rate in Gb/sec" in r.note


def test_the_interface_is_the_one_holding_the_source_address() -> None:
    assert link_rate.interface_of("127.0.0.1") == "lo"
    assert link_rate.interface_of("192.0.2.77") is None  # TEST-NET-1: on no interface here
    assert link_rate.hardware_address("lo") == "00:00:00:00:00:00"


# --------------------------------------------------------------------------- the transfer


def test_node_0_measures_a_transfer_to_decodes_node(run_dir: Path, job_plan: PlanFile, sink: kv_stream.Sink) -> None:
    nbytes, repeats = 8 * MIB, 3
    c = kv_ceiling.measure(run_dir, job_plan, 0, HOSTS, stream_bytes=nbytes, repeats=repeats)
    assert c.status == "measured", c.reason
    assert c.method == "tcp_stream" and c.bytes == nbytes and c.repeats == repeats and len(c.seconds) == repeats
    # every byte arrived at decode-0's node, the untimed first transfer too (the sink marks itself
    # served just after its last answer)
    assert sink.served.wait(5) and sink.received == nbytes * (repeats + 1) and sink.refused == []
    assert (c.src_device, c.dst_device, c.interface) == ("node 0 127.0.0.1", "node 1 127.0.0.2", "lo")
    assert c.servers == ["prefill-0", "decode-0"] and c.node == 0
    # lo has no line rate: the ceiling is the median transfer, the bound the fastest one
    assert c.line_rate_gbps is None and "lo is a virtual interface" in c.line_rate_note
    rates = [nbytes / s / 1e9 for s in c.seconds]
    assert c.gbps == pytest.approx(statistics.median(rates)) and c.best_gbps == pytest.approx(max(rates))
    assert c.took_s is not None and c.took_s < kv_ceiling.TIMEOUT_S
    assert "tcp_stream, node 0 127.0.0.1 -> node 1 127.0.0.2 over lo, 8 MiB, median of 3" in c.describe()
    assert "no line rate: lo is a virtual interface" in c.describe()


def test_the_rdma_ports_of_prefills_ucx_bound_the_transfer(
    run_dir: Path, job_plan: PlanFile, sink: kv_stream.Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    # prefill-0's server runs with the NIC detection's UCX_NET_DEVICES; this node's sysfs has the port.
    sysfs = run_dir / "sys"
    _rdma_port(sysfs, "mlx5_0", 1, "400 Gb/sec (4X NDR)")
    monkeypatch.setattr(link_rate, "SYSFS", sysfs)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | {"UCX_NET_DEVICES": "mlx5_0:1"}
    server = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=env)
    try:
        atomic.write_json(RunDir(run_dir).proc_record(0), [{"name": "prefill-0", "pid": server.pid, "create_time": 0}])
        c = kv_ceiling.measure(run_dir, job_plan, 0, HOSTS, stream_bytes=4 * MIB, repeats=2)
    finally:
        server.communicate(timeout=10)  # closing its stdin ends it
    assert c.status == "measured" and c.interface == "mlx5_0:1" and c.line_rate_gbps == pytest.approx(50.0), c
    assert c.best_gbps == pytest.approx(50.0) and c.gbps == pytest.approx(min(50.0, c.measured_gbps or 0))
    assert "line rate 50.00 GB/s (UCX_NET_DEVICES of prefill-0: mlx5_0:1 400 Gb/sec (4X NDR))" in c.describe()


def test_the_sink_serves_only_this_jobs_sender(run_dir: Path, sink: kv_stream.Sink) -> None:
    port = json.loads(RunDir(run_dir).kv_sink.read_text())["port"]
    with pytest.raises(OSError):
        kv_stream.send(HOSTS[1], port, b"\0" * kv_stream.DIGEST_BYTES, MIB, 1, timeout=10)
    assert not sink.served.is_set() and "no proof of the job's secret" in sink.refused[0]
    assert sink.received == 0
    # More than it accepts is refused too, before any byte is read.
    digest = kv_stream.secret_digest(RunDir(run_dir).secret)
    with pytest.raises(OSError):
        kv_stream.send(HOSTS[1], port, digest, MIB, kv_stream.MAX_TRANSFERS, timeout=10)
    assert "over this sink's bounds" in sink.refused[1]
    seconds, local = kv_stream.send(HOSTS[1], port, digest, MIB, 2, timeout=10)
    assert len(seconds) == 2 and local == "127.0.0.1" and sink.served.wait(5)
    # Served once, the sink stops listening.
    sink._thread.join(5)  # type: ignore[union-attr]
    with pytest.raises(OSError):
        socket.create_connection((HOSTS[1], port), timeout=5).close()


def test_what_cannot_be_measured_across_hosts_is_missing_with_why(
    run_dir: Path, job_plan: PlanFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kv_ceiling, "SINK_WAIT_S", 0.3)
    # Nobody listens on decode-0's node: a bounded wait, then why.
    c = kv_ceiling.measure(run_dir, job_plan, 0, HOSTS)
    assert c.status == "missing" and c.method == "tcp_stream" and c.gbps is None
    assert "decode-0's node 1 did not listen for the transfer within 0.3 s" in c.reason
    # A transfer past its bound is stopped, and the sink lives on, its connection dropped.
    run = RunDir(run_dir)
    with kv_stream.Sink(HOSTS[1], 1, kv_stream.secret_digest(run.secret), run.kv_sink) as s:
        c = kv_ceiling.measure(run_dir, job_plan, 0, HOSTS, timeout=0.3, stream_bytes=kv_stream.MAX_BYTES)
        assert c.status == "missing" and "the transfers did not end within" in c.reason, c.reason
        assert not s.served.is_set()
    # decode-0's node could not listen: its record says why, and so does the ceiling.
    with kv_ceiling.sink(run_dir, job_plan, 1, {0: "127.0.0.1", 1: "192.0.2.77"}):
        assert "error" in json.loads(run.kv_sink.read_text())
        c = kv_ceiling.measure(run_dir, job_plan, 0, {0: "127.0.0.1", 1: "192.0.2.77"})
    assert c.status == "missing" and "decode-0's node 1 could not listen for the transfer: " in c.reason
    run.kv_sink.unlink()
    # prefill-0 on another host than the node that measures: no sender there.
    c = kv_ceiling.measure(run_dir, job_plan, 1, {0: "127.0.0.1", 1: "127.0.0.2"})
    assert c.status == "missing" and "prefill-0 runs on node 0 (127.0.0.1), not on node 1" in c.reason


def test_only_decodes_node_listens_and_only_across_hosts(run_dir: Path, job_plan: PlanFile) -> None:
    run = RunDir(run_dir)
    with kv_ceiling.sink(run_dir, job_plan, 0, HOSTS):  # prefill-0's node
        assert not run.kv_sink.exists()
    with kv_ceiling.sink(run_dir, job_plan, 1, {0: "127.0.0.1", 1: "127.0.0.1"}):  # one host
        assert not run.kv_sink.exists()
    with kv_ceiling.sink(run_dir, job_plan, 1, HOSTS):
        rec = json.loads(run.kv_sink.read_text())
        assert rec["node"] == 1 and rec["addr"] == HOSTS[1] and rec["port"] > 0
    assert not run.kv_sink.exists()


# --------------------------------------------------------------------------- the record and the verdict


def _across(line_rate: float | None, seconds: list[float]) -> KvCeiling:
    return KvCeiling(
        status="measured",
        method="tcp_stream",
        src_device="node 0 10.0.0.1",
        dst_device="node 1 10.0.0.2",
        interface="ens1f0",
        line_rate_gbps=line_rate,
        line_rate_note="100000 Mb/s" if line_rate else "ens1f0 is a device whose speed is unknown (-1)",
        bytes=1 << 30,
        repeats=len(seconds),
        seconds=seconds,
        servers=["prefill-0", "decode-0"],
    )


def test_the_ceiling_is_the_lower_of_the_line_rate_and_the_transfer() -> None:
    slow_nic = _across(1.25, [0.5, 0.4, 0.45])  # transfers at 2.1-2.7 GB/s over a 10 Gb/s line: impossible
    assert slow_nic.gbps == 1.25 and slow_nic.best_gbps == 1.25
    fast_nic = _across(12.5, [0.5, 0.4, 0.45])
    assert fast_nic.gbps == pytest.approx((1 << 30) / 0.45 / 1e9) and fast_nic.best_gbps == 12.5
    assert "line rate 12.50 GB/s (100000 Mb/s)" in fast_nic.describe() and "2.39 GB/s measured" in fast_nic.describe()
    unknown = _across(None, [0.5, 0.4, 0.45])
    assert unknown.best_gbps == pytest.approx((1 << 30) / 0.4 / 1e9)
    assert "no line rate: ens1f0 is a device whose speed is unknown (-1)" in unknown.describe()


def test_a_record_from_before_the_cross_host_fields_reads_as_it_did(tmp_path: Path) -> None:
    old = {"status": "measured", "method": "host_memcpy", "src_device": "host (x)", "dst_device": "host (x)"}
    path = tmp_path / "kv_ceiling.json"
    path.write_text(json.dumps(old | {"bytes": 1 << 28, "repeats": 2, "seconds": [0.05, 0.04], "node": 0}))
    c = read(path)
    assert c is not None and c.status == "measured" and c.interface is None and c.line_rate_gbps is None
    assert c.gbps == pytest.approx(statistics.median([(1 << 28) / 0.05 / 1e9, (1 << 28) / 0.04 / 1e9]))
    assert c.describe().endswith("median of 2)") and "line rate" not in c.describe()


def _handoff(gbps: float) -> KvHandoffSummary:
    n, size = 4, 1 << 30
    return KvHandoffSummary(
        connector="pdbench",
        source="connector_records",
        transfers=n,
        bytes_total=n * size,
        bytes_per_transfer=size,
        lane="tcp",
        judged_min_bytes=0,
        judged_transfers=n,
        judged_bytes=n * size,
        judged_gbps=gbps,
    )


def test_the_verdict_judges_a_cross_host_point_against_it() -> None:
    t = ValidityThresholds(kv_judged_min_bytes=0, kv_fixed_cost_ms=0, kv_min_ceiling_share=0.05)
    ceiling = _across(12.5, [0.5, 0.4, 0.45])  # 2.39 GB/s measured, under the 12.5 GB/s line
    r, h = judge(_handoff(2.0), ceiling, t, "pdbench")
    assert r.status == "passed" and h is not None and h.share == pytest.approx(2.0 / ceiling.gbps)  # type: ignore[operator]
    r, h = judge(_handoff(0.05), ceiling, t, "pdbench")
    assert r.status == "failed" and r.detail.startswith("degraded_transport: lane tcp: ") and h is not None
    assert f"of the ceiling {ceiling.describe()}, below 5%" in r.detail and h.flag == "degraded_transport"
    # Faster than the single stream but within the line rate: RDMA may be; not an error.
    assert judge(_handoff(9.0), ceiling, t, "pdbench")[0].status == "passed"
    # Above the line rate: nothing moved it that fast.
    r, h = judge(_handoff(20.0), ceiling, t, "pdbench")
    assert r.status == "not_checked" and h is not None and h.flag == "metric_error"
    assert "above the line rate of ens1f0 (12.5 GB/s)" in r.detail
