"""The proxy's MoRI-IO flows driven by the installed vLLM's own MoRI-IO code, not by a reading of it.

vLLM's MoRI-IO connector imports without MoRI (it only refuses to build its RDMA engine), so
its message code runs here as it runs on a cluster:

- registration: vLLM's heartbeat (`MoRIIOConnectorWorker._start_heartbeat`, the
  `MoRIIOHeartbeat` process it starts) registers each instance with the proxy;
- request enrichment: the request id the proxy gives both legs is read back by vLLM's
  `get_peer_zmq_from_request_id` / `parse_moriio_zmq_address`, the kv_transfer_params by
  `MoRIIOConnectorMetadata.add_new_req` (what the scheduler hands the worker);
- READ: vLLM's prefill answer is `MoRIIOConnectorScheduler.request_finished` on the params the
  proxy sent, and decode must get it as vLLM's router contract says: forwarded as it is;
- WRITE: vLLM's decode-side `update_state_after_alloc` runs on the params and request id the
  proxy sent decode, and must notify the prefill rank that took the prefill leg;
- configuration: each server's rendered kv-transfer-config, read by vLLM's `MoRIIOConfig`,
  points at the proxy's registration socket in the proxy's mode.

The vLLM objects these functions belong to need a model and a device; the tests hand them
namespaces carrying only the attributes the functions read, so a vLLM that reads (or sends)
something else fails here rather than on a cluster. Gen-1 registrations come from older vLLM
(and InferenceX's seed proxy, see docs/parity.md); the installed vLLM only heartbeats (Gen-2).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from types import MethodType, SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from conftest import require_vllm
from helpers.proxy_fakes import CHUNKS, COMPLETION, DONE, Fake, moriio_stack, read_all, run, wait_health

from harness.config import load_recipe
from harness.render.commands import concrete, kv_transfer_config, node_addr, proxy_argv
from harness.render.preflight_spec import preflight_spec
from harness.topology import plan

require_vllm(module_level=True)

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_common as common  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_connector as connector  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

MoRIIOMode = common.MoRIIOMode
Scheduler = connector.MoRIIOConnectorScheduler


@dataclass
class Instance:
    """What one vLLM instance's MoRI-IO connector is configured with (its extra config)."""

    role: str  # "P" | "D"
    handshake_port: int
    notify_port: int  # the base: rank (dp, tp) listens on base + get_port_offset(dp, tp)
    dp_size: int = 1
    tp_size: int = 1
    engine_id: str = field(default_factory=lambda: f"engine-{uuid.uuid4()}")

    def zmq_address(self) -> str:
        # What vLLM's heartbeat sends (rank 0 of the instance: its base ports).
        return f"host:127.0.0.1,handshake:{self.handshake_port},notify:{self.notify_port}"


def vllm_heartbeat(inst: Instance, fake: Fake, mode: MoRIIOMode, endpoint: str) -> Any:
    """vLLM's own registration: its worker's heartbeat, as rank 0 of the instance starts it."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    worker = SimpleNamespace(
        is_producer=inst.role == "P",
        request_address=fake.url.removeprefix("http://"),
        local_ip="127.0.0.1",
        handshake_port=inst.handshake_port,
        notify_port=inst.notify_port,
        moriio_config=SimpleNamespace(dp_size=inst.dp_size, tp_size=inst.tp_size),
        mode=mode,
        proxy_ip=host,
        proxy_ping_port=int(port),
    )
    return connector.MoRIIOConnectorWorker._start_heartbeat(worker)  # type: ignore[arg-type]


def engine_request_id(x_request_id: str, chat: bool = False, randomized: bool = True) -> str:
    """The id vLLM's engine gives a request from its X-Request-Id: `cmpl-{id}` (chat:
    `chatcmpl-{id}`), `-{index}` per prompt for completions, then `-{8 hex}` unless
    VLLM_DISABLE_REQUEST_ID_RANDOMIZATION (the MI355X model env sets it) (vLLM's serving.py
    and input_processor.py)."""
    rid = f"chatcmpl-{x_request_id}" if chat else f"cmpl-{x_request_id}-0"
    return f"{rid}-{uuid.uuid4().hex[:8]}" if randomized else rid


def vllm_prefill_answer(inst: Instance, dp_rank: int, request_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """The kv_transfer_params vLLM's producer answers a length-capped prefill leg with."""
    scheduler = SimpleNamespace(
        is_producer=True,
        mode=MoRIIOMode.READ,
        _has_mamba=False,
        get_exchange_clipped_blocks=lambda block_ids: [list(g) for g in block_ids],
        _reqs_need_send={},
        _deferred_send_deadlines={},
        _defer_timeout=60.0,
        engine_id=inst.engine_id,
        host_ip="127.0.0.1",
        handshake_port=inst.handshake_port,
        side_notify_port=inst.notify_port,
        _global_dp_rank=dp_rank,
        vllm_config=SimpleNamespace(
            parallel_config=SimpleNamespace(
                data_parallel_size=inst.dp_size,
                data_parallel_size_local=inst.dp_size,
                tensor_parallel_size=inst.tp_size,
            )
        ),
    )
    request = SimpleNamespace(
        request_id=request_id, kv_transfer_params=dict(params), status=RequestStatus.FINISHED_LENGTH_CAPPED
    )
    delay_free, answer = Scheduler.request_finished(scheduler, request, [[7, 8, 9]])  # type: ignore[arg-type]
    # The params the proxy sent made vLLM hold the blocks for decode.
    assert delay_free is True and answer is not None, (params, answer)
    return answer


@dataclass
class VllmPrefill(Fake):
    """A prefill whose answer is vLLM's own (request_finished on what the proxy sent it)."""

    instance: Instance | None = None
    answers: list[dict[str, Any]] = field(default_factory=list)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        assert self.instance is not None
        body = await request.json()
        self.received.append((request.headers.copy(), body))
        self.started.set()
        if self.wait_for is not None:
            await asyncio.wait_for(self.wait_for.started.wait(), 5)
        rank = int(request.headers.get("X-data-parallel-rank", "0"))
        rid = engine_request_id(request.headers["X-Request-Id"])
        answer = vllm_prefill_answer(self.instance, rank, rid, body["kv_transfer_params"])
        self.answers.append(answer)
        return web.json_response({"id": "p", "choices": [{"index": 0, "text": "x"}], "kv_transfer_params": answer})


def parsed(params: dict[str, Any], request_id: str, write_mode: bool) -> Any:
    """The ReqMeta vLLM's scheduler hands its worker for these params (add_new_req)."""
    meta = common.MoRIIOConnectorMetadata()
    meta.add_new_req(request_id, [[1, 2, 3]], dict(params), write_mode=write_mode)
    return (meta.reqs_to_save if write_mode else meta.reqs_to_recv)[request_id]


def test_read_flow_against_vllms_heartbeat_answer_and_parser() -> None:
    P = Instance("P", handshake_port=6301, notify_port=61005, dp_size=2)
    D = Instance("D", handshake_port=6401, notify_port=62005, tp_size=2)
    p = VllmPrefill("prefill", kv=None, instance=P)
    d = Fake("decode")

    async def body() -> None:
        async with moriio_stack([p, d]) as (client, _ctx, endpoint):
            beats = [vllm_heartbeat(P, p, MoRIIOMode.READ, endpoint), vllm_heartbeat(D, d, MoRIIOMode.READ, endpoint)]
            try:
                state = await wait_health(client, 200)
                assert state["transfer_mode"] == "read"
                assert [(b["role"], b["url"], b["source"], b["dp_size"]) for b in state["backends"]] == [
                    ("prefill", p.url, "gen2", 2),
                    ("decode", d.url, "gen2", 1),
                ]
                for _ in range(2):  # one request per prefill DP rank
                    resp = await client.post("/v1/completions", json=COMPLETION)
                    assert resp.status == 200 and await read_all(resp) == b"".join(CHUNKS) + DONE
                for beat in beats:
                    beat.check_health()  # vLLM's heartbeat process ran throughout
            finally:
                for beat in beats:
                    beat.shutdown()

    run(body)
    assert len(p.received) == len(d.received) == len(p.answers) == 2
    ranks = []
    for (ph, pb), (dh, db), answer in zip(p.received, d.received, p.answers, strict=True):
        assert ph["X-Request-Id"] == dh["X-Request-Id"]
        d_rid = engine_request_id(dh["X-Request-Id"])
        rank = int(ph["X-data-parallel-rank"])
        ranks.append(rank)
        # Each side finds its peer in the request id, as vLLM parses it.
        for randomized in (True, False):
            for chat in (True, False):
                rid_as_engine = engine_request_id(ph["X-Request-Id"], chat, randomized)
                assert common.get_peer_zmq_from_request_id(rid_as_engine, is_producer=True) == D.zmq_address()
                assert common.get_peer_zmq_from_request_id(rid_as_engine, is_producer=False) == P.zmq_address()
        assert common.parse_moriio_zmq_address(P.zmq_address()) == ("127.0.0.1", 6301, 61005)
        # Decode gets vLLM's prefill answer as it is (vLLM's router contract) ...
        params = db["kv_transfer_params"]
        assert {k: params.get(k) for k in answer} == answer, params
        assert answer["remote_dp_rank"] == rank and answer["remote_block_ids"] == [[7, 8, 9]]
        # ... and vLLM's decode reads from it the prefill rank and blocks that hold the KV.
        meta = parsed(params, d_rid, write_mode=False)
        assert meta == parsed(answer, d_rid, write_mode=False)
        assert (meta.remote_host, meta.remote_handshake_port, meta.remote_notify_port) == ("127.0.0.1", 6301, 61005)
        assert (meta.remote_engine_id, meta.remote_block_ids, meta.transfer_id) == (
            P.engine_id,
            [[7, 8, 9]],
            pb["kv_transfer_params"]["transfer_id"],
        )
        assert (meta.remote_dp_rank, meta.remote_dp_size, meta.tp_size) == (rank, 2, 1)
        assert db["max_tokens"] == 6  # COMPLETION asks 7: prefill made the first
    assert sorted(ranks) == [0, 1]


def test_write_flow_against_vllms_heartbeat_and_decode_notify() -> None:
    P = Instance("P", handshake_port=6301, notify_port=61005, dp_size=2)
    D = Instance("D", handshake_port=6401, notify_port=62005)
    d = Fake("decode")
    p = VllmPrefill("prefill", kv=None, instance=P, wait_for=d)  # answers only once decode has its leg

    async def body() -> None:
        async with moriio_stack([p, d], moriio_mode="write") as (client, _ctx, endpoint):
            beats = [vllm_heartbeat(P, p, MoRIIOMode.WRITE, endpoint), vllm_heartbeat(D, d, MoRIIOMode.WRITE, endpoint)]
            try:
                state = await wait_health(client, 200)
                assert state["transfer_mode"] == "write"
                for _ in range(2):
                    d.started.clear()
                    resp = await client.post(
                        "/v1/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
                    )
                    assert resp.status == 200 and await read_all(resp) == b"".join(CHUNKS) + DONE
                    await asyncio.wait_for(_prefill_done(p, len(d.received)), 5)
            finally:
                for beat in beats:
                    beat.shutdown()

    run(body)
    ranks = []
    for (ph, pb), (dh, db) in zip(p.received, d.received, strict=True):
        assert ph["X-Request-Id"] == dh["X-Request-Id"]
        p_rid, d_rid = (
            engine_request_id(ph["X-Request-Id"], chat=True),
            engine_request_id(dh["X-Request-Id"], chat=True),
        )
        rank = int(ph["X-data-parallel-rank"])
        ranks.append(rank)
        tid = pb["kv_transfer_params"]["transfer_id"]
        # Prefill (the producer) writes into the decode instance the proxy paired it with.
        meta = parsed(pb["kv_transfer_params"], p_rid, write_mode=True)
        assert (meta.remote_host, meta.remote_handshake_port, meta.remote_notify_port) == ("127.0.0.1", 6401, 62005)
        assert (meta.transfer_id, meta.tp_size, meta.remote_dp_size) == (tid, 1, 1)
        # Decode waits for the KV and tells the prefill rank that took the leg where to write it.
        decode = _vllm_write_decode()
        request = SimpleNamespace(
            request_id=d_rid, kv_transfer_params=dict(db["kv_transfer_params"]), num_prompt_tokens=16
        )
        assert Scheduler.get_num_new_matched_tokens(decode, request, 0) == (16, True)  # type: ignore[arg-type]
        blocks = SimpleNamespace(get_block_ids=lambda: ([4, 5],))
        Scheduler.update_state_after_alloc(decode, request, blocks, 16)  # type: ignore[arg-type]
        assert decode.notified == [
            {
                "req_id": d_rid,
                "transfer_id": tid,
                "block_notify_list": [4, 5],
                "host": "127.0.0.1",
                "port": P.notify_port + common.get_port_offset(rank, 0),  # where that rank listens
            }
        ]
        assert decode.transfer_id_to_request_id == {tid: d_rid}
    assert sorted(ranks) == [0, 1]


async def _prefill_done(p: VllmPrefill, n: int) -> None:
    while len(p.answers) < n:  # the WRITE prefill leg ends in the background
        await asyncio.sleep(0.01)


def _vllm_write_decode() -> Any:
    """A WRITE-mode decode scheduler (rank 0, TP 1) with just what its request hooks read."""
    decode = SimpleNamespace(
        is_producer=False,
        mode=MoRIIOMode.WRITE,
        transfer_id_to_request_id={},
        request_id_to_transfer_id={},
        _global_dp_rank=0,
        _is_kv_master=True,
        tp_size=1,
        notified=[],
    )
    decode.map_request_id = MethodType(Scheduler.map_request_id, decode)
    decode.send_notify_block = lambda **kw: decode.notified.append(kw)
    return decode


def test_rendered_extra_config_is_what_vllms_moriio_config_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each server's rendered kv-transfer-config, read by vLLM's MoRIIOConfig as every TP rank
    reads it: the proxy's registration address and mode, the server's HTTP port, and ports
    that no two ranks on a node share and every node's preflight checks free."""
    rr = load_recipe("dsr1-fp8-mi355x-moriio-1p2d")
    p = plan(rr)
    argv = [a if isinstance(a, str) else a.text for a in proxy_argv(rr, p)]
    proxy_port, proxy_mode = int(argv[argv.index("--moriio-port") + 1]), argv[argv.index("--moriio-mode") + 1]
    free = preflight_spec(rr, p, "/opt/pdbench").ports
    taken: dict[int, list[int]] = {}
    for w in [*p.role("prefill"), *p.role("decode")]:
        rendered = kv_transfer_config(rr, w)
        extra = {
            k: v if isinstance(v, (bool, int)) else concrete(v)
            for k, v in rendered["kv_connector_extra_config"].items()
        }
        config = KVTransferConfig(
            kv_connector=rendered["kv_connector"], kv_role=rendered["kv_role"], kv_connector_extra_config=extra
        )
        assert common.get_moriio_mode(config).value == proxy_mode
        tp = getattr(rr.recipe.topology, w.role).tp
        monkeypatch.setattr(common, "get_tensor_model_parallel_world_size", lambda tp=tp: tp)
        for rank in range(tp):
            monkeypatch.setattr(common, "get_tensor_model_parallel_rank", lambda rank=rank: rank)
            parallel = SimpleNamespace(data_parallel_rank=0, data_parallel_size_local=1, data_parallel_size=1)
            mori = common.MoRIIOConfig.from_vllm_config(
                SimpleNamespace(kv_transfer_config=config, parallel_config=parallel)  # type: ignore[arg-type]
            )
            assert (mori.proxy_ip, mori.proxy_ping_port) == (concrete(node_addr(0)), proxy_port)
            assert mori.http_port == w.port and mori.read_mode == (proxy_mode == "read")
            # The ports this rank binds: handshake (MoRIIOConnectorWorker) and notify.
            taken.setdefault(w.node, []).extend(
                [mori.handshake_port + common.get_port_offset(mori.dp_rank, mori.tp_rank), mori.notify_port]
            )
    for node, ports in taken.items():
        assert len(ports) == len(set(ports)), (node, sorted(ports))
        assert set(ports) <= set(free[node]), (node, sorted(set(ports) - set(free[node])))
