"""The proxy's legs for NIXL's push, driven through the installed vLLM's own push code.

vLLM's NixlPushConnector matches prefill's finished blocks to decode's registration by request id
alone (`NixlPushConnectorWorker._pop_matching_finished_blocks`: the exact id, then the ids without
vLLM's random `-<8 hex>` suffix), not by the kv_transfer_params prefill answered: the two legs
must carry one X-Request-Id, or decode's request waits for a write that never comes. Here the
proxy's two-phase flow runs against fake servers; vLLM's push scheduler answers the prefill leg
(`request_finished`) and registers the decode leg (`update_state_after_alloc`) with the params and
ids the proxy sent, and vLLM's worker matches them. The functions run on namespaces that carry
only the attributes they read, so a vLLM that reads something else fails here.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from conftest import require_vllm
from helpers.proxy_fakes import COMPLETION, Fake, read_all, run, stack

require_vllm(module_level=True)

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import push_scheduler, push_worker  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

Scheduler = push_scheduler.NixlPushConnectorScheduler
Worker = push_worker.NixlPushConnectorWorker
PROMPT = 256


def engine_id(x_request_id: str) -> str:
    """vLLM's id for a completion from its X-Request-Id: `cmpl-{id}-0`, then `-{8 hex}` of its own
    (serving.py, input_processor.assign_request_id): each leg gets a different suffix."""
    return f"cmpl-{x_request_id}-0-{uuid.uuid4().hex[:8]}"


def _prefill_scheduler() -> Any:
    return SimpleNamespace(
        _stop_heartbeat=lambda rid: None,
        _push_registration_deadlines={},
        _reqs_not_processed=set(),
        _reqs_need_save={},
        _reqs_need_send={},
        _kv_lease_duration=30,
        get_exchange_clipped_blocks=lambda blocks: blocks,
        _finished_request_blocks={},
        _newly_finished_push_blocks={},
        engine_id="prefill-engine",
        side_channel_host="127.0.0.1",
        side_channel_port=5600,
        transfer_tp_size=1,
        vllm_config=SimpleNamespace(
            parallel_config=SimpleNamespace(decode_context_parallel_size=1, pipeline_parallel_size=1)
        ),
        _TRANSFER_MODE="push",
    )


def _decode_scheduler() -> Any:
    return SimpleNamespace(
        _reqs_in_batch=set(),
        use_host_buffer=False,
        get_exchange_clipped_blocks=lambda blocks: blocks,
        _push_pending_registrations={},
        _push_registration_deadlines={},
        _push_registration_timeout=480.0,
        _reqs_need_recv={},
        engine_id="decode-engine",
        side_channel_host="127.0.0.1",
        side_channel_port=5601,
        vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=1)),
    )


def _request(rid: str, params: dict[str, Any]) -> Any:
    return SimpleNamespace(
        request_id=rid,
        kv_transfer_params=dict(params),
        status=RequestStatus.FINISHED_LENGTH_CAPPED,
        num_computed_tokens=PROMPT,
        prompt_token_ids=list(range(PROMPT)),
    )


def _vllm_answer(params: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's push prefill answers a length-capped leg with."""
    delay_free, answer = Scheduler.request_finished(_prefill_scheduler(), _request("cmpl-x-0-00000000", params), ([1],))
    assert delay_free is True and answer is not None and answer["transfer_mode"] == "push"
    return answer


def test_push_matches_the_blocks_of_each_request_the_proxy_sent() -> None:
    from harness.proxy.flows import TwoPhaseFlow

    d = Fake("decode")
    p = Fake("prefill", kv=_vllm_answer(TwoPhaseFlow.PREFILL_KV))

    async def body() -> None:
        async with stack([p], [d], connector="nixlpush") as client:
            for _ in range(2):
                resp = await client.post("/v1/completions", json=COMPLETION)
                assert resp.status == 200
                await read_all(resp)

    run(body)
    assert len(p.received) == len(d.received) == 2
    prefill, finished, registrations = _prefill_scheduler(), {}, []
    for (ph, pb), (dh, db) in zip(p.received, d.received, strict=True):
        assert dh["X-Request-Id"] == ph["X-Request-Id"]
        # Prefill (vLLM's producer): it keeps the finished blocks for a decode registration.
        p_req = _request(engine_id(ph["X-Request-Id"]), pb["kv_transfer_params"])
        delay_free, _ = Scheduler.request_finished(prefill, p_req, ([len(finished) + 3],))
        assert delay_free is True and p_req.request_id in prefill._newly_finished_push_blocks
        finished[p_req.request_id] = prefill._newly_finished_push_blocks[p_req.request_id]
        # Decode (vLLM's consumer): the forwarded params make it register its blocks with prefill.
        decode = _decode_scheduler()
        d_req = _request(engine_id(dh["X-Request-Id"]), db["kv_transfer_params"])
        Scheduler.update_state_after_alloc(
            decode, d_req, SimpleNamespace(get_unhashed_block_ids_all_groups=lambda: ([7],)), PROMPT
        )
        (reg,) = decode._push_pending_registrations.values()
        assert reg["remote_engine_id"] == "prefill-engine" and reg["request_id"] == d_req.request_id
        assert d_req.request_id != p_req.request_id  # precondition: only the base ids agree
        registrations.append((reg, p_req.request_id))
    # Prefill's writer matches each registration to its own request's blocks, and to no other's.
    writer = SimpleNamespace(_push_finished_blocks=dict(finished))
    for reg, p_rid in registrations:
        match = Worker._pop_matching_finished_blocks(writer, reg["request_id"])  # type: ignore[arg-type]
        assert match is not None and match[0] == p_rid
    assert writer._push_finished_blocks == {}
