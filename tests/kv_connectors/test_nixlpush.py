"""NIXL's push arm (vLLM's NixlPushConnector, table entry `nixlpush`): prefill counts the transfers.

Under push prefill's worker records each completed WRITE (vLLM 0.32 nixl/push_worker.py:
`_pop_done_transfers(self._sending_transfers)`), so NIXL's histograms grow on prefill's /metrics
while decode's stay at zero, and UCX's account of the write is in prefill's log. Every reader of
the connector's evidence must read that role: the KV rule, the probe's settle wait, the TTFT
breakdown's KV mean, the handoff and its lane, the transport's early check. Prefill's logs in
tests/data/ucx_proto_info are real: prefill-push-ipc.log of llama8b-shape-bf16-h200x2-nixlpush-1p1d
(two H200s, vLLM 0.26.0, nixl-cu13 1.3.2, ISL 1k, block 16, 2026-11-30) and prefill-push-cpu.log
of tiny-fp32-cpu-nixlpush-1p1d (vLLM 0.32.0 CPU, nixl 1.5.1), except prefill-push-tcp.synthetic.log
(the GPU push's table as UCX prints it with no GPU transport; no such run was made).
"""

from __future__ import annotations

import time
from dataclasses import fields
from pathlib import Path

from helpers.kv_fakes import GIB, NixlDecode, T, ceiling

from harness.bench.ttft_breakdown import kv_transfer_ms
from harness.bench.validity_probe import PointProbe
from harness.config import load_recipe
from harness.kv_connectors import get_kv
from harness.render.commands import kv_transfer_config
from harness.topology import plan
from harness.validity import ClientCounts, ServerScrapes, ValidityThresholds, evaluate, receives_behind, ucx_lanes
from harness.validity.kv_handoff import point_handoff
from harness.validity.kv_transport import early_reason, judge

DATA = Path(__file__).parents[1] / "data" / "ucx_proto_info"
PUSH_IPC, PUSH_TCP = DATA / "prefill-push-ipc.log", DATA / "prefill-push-tcp.synthetic.log"
PULL_IPC = DATA / "decode-ipc.log"  # real: decode's log under the pull
PUSH_CPU = DATA / "prefill-push-cpu.log"  # real: prefill's log of tiny-fp32-cpu-nixlpush-1p1d
CLIENT = ClientCounts(prompt_tokens=7168, output_tokens=896, completed=28, failed=0)
PER_REQUEST = {  # decode's scheduler, per request of CLIENT (256 prompt tokens, 32 output)
    "vllm:prompt_tokens_total": 256,
    "vllm:generation_tokens_total": 32,
    "vllm:external_prefix_cache_hits_total": 256,
    'vllm:prompt_tokens_by_source_total{source="local_compute"}': 0,
}
NIXL = ("vllm:nixl_xfer_time_seconds_count", "vllm:nixl_num_failed_transfers_total")


def _text(series: dict[str, float], n: float) -> str:
    lines = []
    for key, per in series.items():
        name, _, labels = key.partition("{")
        inner = ",".join(x for x in ('engine="0"', labels.rstrip("}")) if x)
        lines.append(f"{name}{{{inner}}} {per * n}")
    return "\n".join(lines)


def _servers(writes: float | None, requests: int = 28) -> dict[str, ServerScrapes]:
    """A 1P1D push point: decode's scheduler counters and its NIXL counters at zero (it drives no
    transfer); prefill's NIXL counters with `writes` completed WRITEs (None: it exports none)."""
    decode = PER_REQUEST | dict.fromkeys(NIXL, 0)
    prefill = {} if writes is None else {NIXL[0]: writes / requests, NIXL[1]: 0}
    return {
        "decode-0": ServerScrapes(role="decode", before=_text(decode, 0), after=_text(decode, requests)),
        "prefill-0": ServerScrapes(role="prefill", before=_text(prefill, 0), after=_text(prefill, requests)),
    }


def _rule(v, name):
    return next(r for r in v.rules if r.name == name)


def test_the_entry_is_nixls_but_counted_on_prefill() -> None:
    pull, push = get_kv("nixl"), get_kv("nixlpush")
    assert push.vllm_class == "NixlPushConnector" and pull.vllm_class == "NixlConnector"
    # One owner: side channel, environment, ports, packages, proxy flow and router use are NIXL's.
    shared = {f.name for f in fields(pull)} - {"name", "title", "summary", "vllm_class", "evidence"}
    assert all(getattr(push, k) == getattr(pull, k) for k in shared), shared
    assert push.proxy.flow == "two_phase" and push.vllm_router is not None
    assert pull.evidence is not None and push.evidence is not None
    assert (pull.evidence.counted_on, push.evidence.counted_on) == ("decode", "prefill")
    assert push.evidence.received == pull.evidence.received and push.evidence.failures == pull.evidence.failures
    assert push.evidence.ucx_operation == "remote memory write by ucp_put*(multi)"


def test_the_cpu_recipe_renders_push_with_producer_and_consumer_roles() -> None:
    rr = load_recipe("tiny-fp32-cpu-nixlpush-1p1d", [], cluster="local")
    p = plan(rr)
    configs = {w.role: kv_transfer_config(rr, w) for w in (*p.role("prefill"), *p.role("decode"))}
    # vLLM's push refuses kv_both (NixlPushConnectorScheduler: no bidirectional transfer).
    assert configs["prefill"]["kv_connector"] == configs["decode"]["kv_connector"] == "NixlPushConnector"
    assert (configs["prefill"]["kv_role"], configs["decode"]["kv_role"]) == ("kv_producer", "kv_consumer")


def test_prefills_writes_prove_the_transfer_and_decodes_zero_is_no_failure() -> None:
    servers = _servers(writes=28)
    v = evaluate(servers, CLIENT, ValidityThresholds(), "nixlpush")
    assert v.roles["decode"].kv_received == 0  # precondition: decode exports the counter, at zero
    assert (v.verdict, v.valid) == ("valid", True), v.reasons
    rule = _rule(v, "kv_transferred")
    assert rule.status == "passed" and "prefill completed 28 KV write(s) for 28 request(s)" in rule.detail
    assert _rule(v, "no_failed_or_expired_transfers").status == "passed"
    # The same scrapes judged as the pull read decode's zero: what the push must not do.
    pull = evaluate(servers, CLIENT, ValidityThresholds(), "nixl")
    assert pull.verdict == "invalid" and "decode completed 0 KV receive(s)" in _rule(pull, "kv_transferred").detail


def test_fewer_writes_than_requests_fail_and_no_prefill_counter_is_not_checked() -> None:
    v = evaluate(_servers(writes=14), CLIENT, ValidityThresholds(), "nixlpush")
    assert (v.verdict, v.valid) == ("invalid", False)
    assert "prefill completed 14 KV write(s) for 28 completed request(s)" in _rule(v, "kv_transferred").detail
    v = evaluate(_servers(writes=None), CLIENT, ValidityThresholds(), "nixlpush")
    assert (v.verdict, v.valid) == ("unverified", None)
    rule = _rule(v, "kv_transferred")
    assert rule.status == "not_checked" and "prefill exports no counter of completed KV write(s)" in rule.detail


def test_the_probe_waits_for_prefills_last_writes() -> None:
    # The point's end scrapes again while the counting role is behind (bounded by RECEIVES_SETTLE_S).
    behind, caught_up = (evaluate(_servers(w), CLIENT, ValidityThresholds(), "nixlpush") for w in (27, 28))
    assert receives_behind(behind, CLIENT, "nixlpush") and not receives_behind(caught_up, CLIENT, "nixlpush")
    # Decode's zero would keep the pull's reading behind for good.
    assert receives_behind(caught_up, CLIENT, "nixl")


def test_the_ttft_breakdowns_kv_mean_is_prefills() -> None:
    servers = _servers(writes=28)
    for s, per in ((servers["prefill-0"], 0.02), (servers["decode-0"], 0.0)):
        s.before += '\nvllm:nixl_xfer_time_seconds_sum{engine="0"} 0'
        s.after += f'\nvllm:nixl_xfer_time_seconds_sum{{engine="0"}} {per * 28}'
    v = evaluate(servers, CLIENT, ValidityThresholds(), "nixlpush")
    mean = kv_transfer_ms(v, "nixlpush")
    assert mean is not None and abs(mean[0] - 20.0) < 1e-9 and mean[1] == 28
    assert kv_transfer_ms(v, "nixl") is None  # decode's histograms saw no transfer


def _handoff_dir(tmp_path: Path, seconds: float) -> tuple[Path, Path, NixlDecode]:
    """Scrapes of a point where prefill wrote three 512 MiB transfers of `seconds` each and decode's
    histograms stayed put; logs: prefill's (the synthetic push table over TCP) and decode's (a real
    pull log, whose read table is not this connector's)."""
    prefill, decode = NixlDecode(), NixlDecode()
    for name, server in (("prefill-0", prefill), ("decode-0", decode)):
        (tmp_path / f"{name}.before.prom").write_text(server.text())
    for _ in range(3):
        prefill.transfer(seconds, GIB // 2, 85, 0.001)
    for name, server in (("prefill-0", prefill), ("decode-0", decode)):
        (tmp_path / f"{name}.after.prom").write_text(server.text())
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "prefill-0.log").write_text(PUSH_TCP.read_text())
    (logs / "decode-0.log").write_text(PULL_IPC.read_text())
    return tmp_path, logs, prefill


TARGETS = [("prefill-0", "prefill", "http://p"), ("decode-0", "decode", "http://d")]


def test_the_handoff_and_its_lane_are_read_from_prefill(tmp_path: Path) -> None:
    scrapes, logs, _ = _handoff_dir(tmp_path, 0.5 * GIB / 0.22e9)
    h = point_handoff("nixlpush", TARGETS, scrapes, [], GIB // 2, logs)
    assert h is not None and h.connector == "nixlpush" and h.transfers == 3 and h.bytes_total == 3 * (GIB // 2)
    assert h.note.startswith("prefill's NIXL histograms")
    assert h.lane == "tcp/lo (software emulation)" and "prefill-0.log" in h.lane_note
    assert "decode-0.log" not in h.lane_note  # decode's log (a pull's read table) is not the push's
    r, section = judge(h, ceiling(2102.8), T.model_copy(update={"kv_judged_min_bytes": GIB // 2}), "nixlpush")
    assert r.status == "failed" and section is not None and section.flag == "degraded_transport"
    assert "UCX wrote the KV by software emulation" in r.detail and "writer thread" in r.detail
    # The pull over the same files: decode's histograms moved nothing.
    assert point_handoff("nixl", TARGETS, scrapes, [], GIB // 2, logs) is None


def test_the_push_lane_is_nixls_multi_put_not_ucxs_own_puts() -> None:
    op = get_kv("nixlpush").evidence.ucx_operation
    lines = PUSH_IPC.read_text().splitlines()
    assert any("APIServer" in x for x in lines)  # precondition: a real prefill log
    (kv,) = ucx_lanes.kv_transfers(ucx_lanes.selections(lines), op)
    assert kv.operation == f"{op} from cuda/GPU0 to cuda/dev[0]" and kv.context == "intra-node cfg#2"
    assert ucx_lanes.describe(kv) == "cuda_ipc/cuda (zero-copy)"
    # A real NIXL log holds UCX's own puts between the servers, one of them emulated: any put
    # would take them for the KV and call a healthy lane emulated.
    real = ucx_lanes.selections(PULL_IPC.read_text().splitlines())
    puts = ucx_lanes.kv_transfers(real, "remote memory write by ucp_put*")
    assert any(ucx_lanes.is_emulated(ucx_lanes.describe(s)) for s in puts)
    assert ucx_lanes.kv_transfers(real, op) == []


def test_the_early_check_reads_prefills_scrapes_and_log(tmp_path: Path) -> None:
    scrapes, logs, prefill = _handoff_dir(tmp_path, 0.5 * GIB / 0.22e9)
    before = (scrapes / "prefill-0.before.prom").read_text()
    t = T.model_copy(update={"kv_judged_min_bytes": 1, "early_check_s": 1})
    why = early_reason([(before, prefill.text())], ceiling(2102.8), t, "tcp/lo (software emulation)", "nixlpush")
    assert why is not None and "UCX wrote the KV by software emulation" in why
    said: list[str] = []
    probe = PointProbe(
        ["prefill-0=prefill@http://127.0.0.1:9", "decode-0=decode@http://127.0.0.1:9"],
        tmp_path,
        t,
        "nixlpush",
        completed=lambda: 3,
        on_invalid=said.append,
        kv_ceiling=ceiling(2102.8),
        logs_dir=logs,
    )
    decode = (scrapes / "decode-0.after.prom").read_text()
    probe.before, probe._started = {"prefill-0": before, "decode-0": decode}, time.monotonic() - 5
    probe._check_early({"prefill-0": prefill.text(), "decode-0": decode})
    assert len(said) == 1 and said[0].startswith("degraded_transport"), said
    assert "lane tcp/lo (software emulation)" in said[0] and "UCX wrote the KV" in said[0]


def test_a_real_cpu_push_log_names_its_lane(tmp_path: Path) -> None:
    """prefill-0.log of a real tiny-fp32-cpu-nixlpush-1p1d job (vLLM 0.32.0 CPU, nixl 1.5.1, one
    point at C=2, 12 KV writes of 1 MiB, 2026-11-30): UCX's boxed tables, NIXL's own puts at start
    (to itself and to decode), and one `ucp_put*(multi)` write of host memory: the KV."""
    lines = PUSH_CPU.read_text().splitlines()
    found = ucx_lanes.selections(lines)
    # Precondition: a real log, vLLM's lines between dozens of UCX tables, several of them puts.
    assert any("APIServer" in x for x in lines) and len(found) > 40
    assert sum(s.operation.startswith("remote memory write by ucp_put*") for s in found) == 8
    op = get_kv("nixlpush").evidence.ucx_operation
    (kv,) = ucx_lanes.kv_transfers(found, op)
    assert (kv.context, kv.operation) == ("intra-node cfg#1", f"{op} from host memory to host")
    assert kv.rows == (("0..inf", "zero-copy", "cma/memory"),)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "prefill-0.log").write_text(PUSH_CPU.read_text())
    lane, note = ucx_lanes.lane_from_logs([logs / "prefill-0.log"], get_kv("nixlpush").evidence)
    assert lane == "cma/memory (zero-copy)" and "prefill-0.log" in note
