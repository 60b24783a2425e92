"""The proxy's Mooncake flow against the installed vLLM's own Mooncake code, without a server.

vLLM's MooncakeConnector imports without Mooncake's transfer engine; its bootstrap server and
its request hooks are plain Python. So here: vLLM's `MooncakeBootstrapServer` runs, prefill
workers register with it through vLLM's own `register_worker_with_bootstrap` (one engine per DP
rank), the proxy asks that server for the engines, and what the proxy sends each leg is read by
vLLM's scheduler hooks (`update_state_after_alloc`, `request_finished`, `add_new_req`); decode's
worker then queries the bootstrap address the proxy gave it (`_connect_to_prefiller_bootstrap`)
and must find the engine the proxy named, at the worker of the DP rank that took the prefill leg.
tests/e2e/test_mooncake_e2e.py runs the whole job for real; this one runs where Mooncake is missing
and covers DP > 1.

The vLLM objects these functions belong to need a model and a device; they get namespaces with
only the attributes the functions read, so a vLLM that reads something else fails here.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import require_vllm
from helpers.proxy_fakes import CHUNKS, COMPLETION, DONE, Fake, read_all, run, stack

from harness.config import load_recipe
from harness.render.commands import concrete, kv_transfer_config, proxy_argv, server_env
from harness.topology import plan

require_vllm(module_level=True)

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as mc  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_utils import MooncakeBootstrapServer  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402


@pytest.fixture
def bootstrap(monkeypatch: pytest.MonkeyPatch) -> Iterator[MooncakeBootstrapServer]:
    """vLLM's bootstrap server on a free port, as a prefill's rank 0 starts it."""
    server = MooncakeBootstrapServer("127.0.0.1", 0)
    server.start(timeout=30)
    monkeypatch.setenv("VLLM_MOONCAKE_BOOTSTRAP_PORT", str(server.port))
    try:
        yield server
    finally:
        server.shutdown()


def _worker(engine_id: str, dp_rank: int, side_channel_port: int) -> Any:
    """A prefill worker as vLLM's registration reads it (local engines: the local server)."""
    return SimpleNamespace(
        vllm_config=SimpleNamespace(kv_transfer_config=None, parallel_config=SimpleNamespace(local_engines_only=True)),
        hostname="127.0.0.1",
        side_channel_port=side_channel_port,
        engine_id=engine_id,
        dp_rank=dp_rank,
        tp_rank=0,
        pp_rank=0,
    )


def _scheduler(producer: bool) -> Any:
    return SimpleNamespace(
        is_kv_producer=producer,
        is_kv_consumer=not producer,
        get_sw_clipped_blocks=lambda block_ids: [list(g) for g in block_ids],
        _reqs_need_recv={},
        _reqs_need_send={},
        _reqs_not_processed=set(),
    )


def _request(request_id: str, params: dict[str, Any]) -> Any:
    return SimpleNamespace(
        request_id=request_id, kv_transfer_params=dict(params), status=RequestStatus.FINISHED_LENGTH_CAPPED
    )


def test_mooncake_flow_against_vllms_bootstrap_server_and_hooks(bootstrap: MooncakeBootstrapServer) -> None:
    engines = {rank: f"engine-{uuid.uuid4()}" for rank in (0, 1)}
    addrs = {rank: f"tcp://127.0.0.1:{17100 + rank}" for rank in engines}
    d = Fake("decode")
    p = Fake("prefill", kv=None, wait_for=d)  # answers only once decode has its leg: concurrent legs

    async def body() -> None:
        for rank, engine in engines.items():
            await mc.MooncakeConnectorWorker.register_worker_with_bootstrap(_worker(engine, rank, 17100 + rank))
        async with stack([p], [d], connector="mooncake", bootstrap_ports=[bootstrap.port]) as client:
            state = await (await client.get("/health")).json()
            assert state["backends"][0]["engine_ids"] == {str(r): e for r, e in engines.items()}
            for _ in range(2):  # one request per DP rank
                resp = await client.post("/v1/completions", json=COMPLETION)
                assert resp.status == 200 and await read_all(resp) == b"".join(CHUNKS) + DONE
                await asyncio.wait_for(_arrived(p, len(d.received)), 5)

    run(body)
    ranks = []
    for (ph, pb), (dh, db) in zip(p.received, d.received, strict=True):
        rid = ph["X-Request-Id"]
        assert dh["X-Request-Id"] == rid
        rank = int(ph["X-data-parallel-rank"])
        ranks.append(rank)
        p_params, d_params = pb["kv_transfer_params"], db["kv_transfer_params"]

        # Prefill (vLLM's producer hooks): it keeps the blocks for a pull under the transfer id.
        prefill = _scheduler(producer=True)
        p_req = _request(f"cmpl-{rid}-0-p", p_params)
        mc.MooncakeConnectorScheduler.update_state_after_alloc(prefill, p_req, SimpleNamespace(), 0)  # type: ignore[arg-type]
        assert p_req.request_id in prefill._reqs_need_send  # no "Missing transfer_id" refusal
        delay_free, _ = mc.MooncakeConnectorScheduler.request_finished(prefill, p_req, ([3, 4],))
        assert delay_free is True
        sent = mc.MooncakeConnectorMetadata()
        sent.add_new_req(p_req.request_id, [[3, 4]], p_req.kv_transfer_params, load_remote_cache=False)

        # Decode (vLLM's consumer hooks): it accepts the params and pulls that transfer id ...
        decode = _scheduler(producer=False)
        d_req = _request(f"cmpl-{rid}-0-d", d_params)
        blocks = SimpleNamespace(get_unhashed_block_ids_all_groups=lambda: ([5, 6],))
        mc.MooncakeConnectorScheduler.update_state_after_alloc(decode, d_req, blocks, 32)  # type: ignore[arg-type]
        assert d_req.request_id in decode._reqs_need_recv  # not "Got invalid KVTransferParams"
        pulls = mc.MooncakeConnectorMetadata()
        pulls.add_new_req(d_req.request_id, [[5, 6]], d_params)
        (pull,) = pulls.reqs_to_recv[engines[rank]].values()
        assert pull.transfer_id == sent.reqs_to_send[p_req.request_id][0] == p_params["transfer_id"]

        # ... from the engine of the rank that took the prefill leg, found where the proxy said.
        agents = SimpleNamespace(_remote_agents={}, _tp_size={}, _pending_bootstrap_queries={})
        agents._pending_bootstrap_queries[pull.remote_bootstrap_addr] = asyncio.Event()

        async def query(addr: str = pull.remote_bootstrap_addr, worker: Any = agents) -> None:
            await mc.MooncakeConnectorWorker._connect_to_prefiller_bootstrap(worker, addr)

        run(query)
        assert pull.remote_engine_id == engines[rank]
        assert agents._remote_agents[pull.remote_engine_id] == {0: {0: addrs[rank]}}
        assert agents._tp_size[pull.remote_engine_id] == 1
    assert sorted(ranks) == [0, 1]


async def _arrived(p: Fake, n: int) -> None:
    while len(p.received) < n:  # the prefill leg runs beside decode's
        await asyncio.sleep(0.01)


def test_rendered_job_points_decode_and_proxy_at_vllms_bootstrap_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 recipe as rendered: the prefill's vLLM starts its bootstrap server (TP and PP
    rank 0 of DP rank 0) on the port the proxy is told, and reads the transfer protocol."""
    rr = load_recipe("dsr1-fp8-h200-mooncake-1p2d", ["connector.side_channel_port=9123"])  # not vLLM's default
    p = plan(rr)
    argv = [a if isinstance(a, str) else a.text for a in proxy_argv(rr, p)]
    told = [int(argv[i + 1]) for i, a in enumerate(argv) if a == "--bootstrap-port"]
    monkeypatch.setattr(mc, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(mc, "get_pp_group", lambda: SimpleNamespace(rank_in_group=0))
    ports = []
    for w in p.role("prefill"):
        monkeypatch.setenv("VLLM_MOONCAKE_BOOTSTRAP_PORT", concrete(server_env(rr, w)["VLLM_MOONCAKE_BOOTSTRAP_PORT"]))
        rendered = kv_transfer_config(rr, w)
        config = SimpleNamespace(
            kv_transfer_config=KVTransferConfig(**rendered),
            parallel_config=SimpleNamespace(
                local_engines_only=False, nnodes_within_dp=1, data_parallel_master_ip="10.0.0.1", data_parallel_index=0
            ),
        )
        assert mc.should_launch_bootstrap_server(config)  # type: ignore[arg-type]
        _, port = mc.get_mooncake_bootstrap_addr(config)  # type: ignore[arg-type]
        ports.append(port)
        assert config.kv_transfer_config.kv_connector_extra_config.get("mooncake_protocol", "rdma") == "rdma"
    assert ports == told == [9123]
    for w in p.role("decode"):
        assert KVTransferConfig(**kv_transfer_config(rr, w)).kv_role == "kv_consumer"  # no server of its own
        assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in server_env(rr, w)
