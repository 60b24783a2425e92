"""Both roles end to end in one process: real schedulers, real worker connectors, fake forward.

Each "engine" is a vLLM Scheduler plus one PdbenchConnector worker per TP rank over
real CPU tensors. The fake forward writes, for every scheduled token, a value
derived from (token, position, layer, rank) into that token's slot. After the
decode engine pulled, its slots must hold exactly prefill's values, at its own
block ids; both schedulers end empty.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import require_vllm

require_vllm(module_level=True)  # CI sets PDBENCH_REQUIRE_VLLM: a missing vLLM fails, never skips

from helpers.connector_engines import (  # noqa: E402
    BS,
    LAYERS,
    TOTAL_HEADS,
    C,
    assert_empty,
    engines,  # noqa: F401  (fixture)
    make_request,
    model_dir,  # noqa: F401  (fixture)
    prefill_and_params,
)
from vllm.v1.request import RequestStatus  # noqa: E402


@pytest.mark.parametrize(
    "p_tp,d_tp",
    [
        (1, 1),
        (2, 2),
        (2, 1),  # decode's rank pulls half its heads from each prefill rank
        (1, 2),  # both decode ranks read prefill's one rank: it frees after both acked
        (4, 2),
        (1, 4),
        (8, 2),  # 4 heads on 8 prefill ranks: replicated; the ranks no one reads are released
    ],
)
def test_decode_slots_hold_prefill_kv_and_both_sides_end_empty(engines: Any, p_tp: int, d_tp: int) -> None:  # noqa: F811
    p = engines("kv_producer", tp=p_tp)
    d = engines("kv_consumer", tp=d_tp)
    # Decode's block ids differ from prefill's: it has other requests' blocks first.
    filler = make_request(70, max_tokens=30)
    d.s.add_request(filler)
    d.step()
    preq, params = prefill_and_params(p, 150)
    dreq = make_request(150, params=params, max_tokens=3, prefix=list(preq.prompt_token_ids or []))
    d.s.add_request(dreq)
    d.run_until(lambda f: dreq.status == RequestStatus.RUNNING or dreq.is_finished(), timeout=10)
    for rank in range(d_tp):
        for layer in range(LAYERS):
            for pos in (0, 15, 16, 100, 148):
                for head in range(*d.spans[rank]):
                    want = p.value(preq.prompt_token_ids[pos], pos, layer, head)
                    assert d.slot(rank, layer, dreq.request_id, pos, head) == want, (rank, layer, pos, head)
    assert d.s.kv_cache_manager.get_block_ids(dreq.request_id)[0] != params["remote_block_ids"]
    d.run_until(lambda f: dreq.is_finished() and filler.is_finished(), timeout=10)
    p.run_until(lambda f: not p.s.requests, timeout=10)  # acked: prefill frees its blocks
    for _ in range(3):
        d.step()
    assert_empty(p.s)
    assert_empty(d.s)


def test_failed_pull_with_fail_policy_errors_and_frees(engines: Any) -> None:  # noqa: F811
    p = engines("kv_producer", lease_s=0.5)
    d = engines("kv_consumer")
    _preq, params = prefill_and_params(p, 64)
    p.run_until(lambda f: not p.s.requests, timeout=10)  # lease expires before decode asks
    dreq = make_request(64, params=params)
    d.s.add_request(dreq)
    fin = d.run_until(lambda f: any(o.request_id == dreq.request_id for o in f), timeout=10)
    assert dreq.status == RequestStatus.FINISHED_ERROR, fin
    for _ in range(3):
        d.step()
    assert_empty(p.s)
    assert_empty(d.s)


def test_failed_pull_with_recompute_policy_recomputes(engines: Any) -> None:  # noqa: F811
    p = engines("kv_producer", lease_s=0.5)
    d = engines("kv_consumer", policy="recompute")
    _, params = prefill_and_params(p, 64)
    p.run_until(lambda f: not p.s.requests, timeout=10)
    dreq = make_request(64, params=params, max_tokens=2)
    d.s.add_request(dreq)
    d.run_until(lambda f: dreq.is_finished(), timeout=10)
    assert dreq.status == RequestStatus.FINISHED_LENGTH_CAPPED
    for _ in range(3):
        d.step()
    assert_empty(d.s)


def test_transfer_stats_reach_the_scheduler(engines: Any) -> None:  # noqa: F811
    p = engines("kv_producer")
    d = engines("kv_consumer")
    _preq, params = prefill_and_params(p, 40)
    dreq = make_request(40, params=params, max_tokens=1)
    d.s.add_request(dreq)
    stats: list[Any] = []
    orig = d.workers[0].get_kv_connector_stats

    def spy() -> Any:
        s = orig()
        if s is not None:
            stats.append(s)
        return s

    d.workers[0].get_kv_connector_stats = spy  # type: ignore[method-assign]
    d.run_until(lambda f: dreq.is_finished(), timeout=10)
    data = stats[0].data
    assert data["recv_bytes"] == [3 * LAYERS * TOTAL_HEADS * BS * C * 4]  # 3 blocks x layers
    red = stats[0].reduce()
    assert red["Num recv"] == 1 and red["Recv throughput (MB/s)"] > 0


def test_job_secret_from_extra_config_gates_the_pull(engines: Any, tmp_path: Any) -> None:  # noqa: F811
    from harness.node.secrets import ensure_job_secret

    secret = str(ensure_job_secret(tmp_path / "job"))
    other = str(ensure_job_secret(tmp_path / "other-job"))
    p = engines("kv_producer", secret_file=secret)
    assert p.workers[0]._worker.server.cfg.secret  # type: ignore[union-attr]
    good = engines("kv_consumer", secret_file=secret)
    preq, params = prefill_and_params(p, 40)
    dreq = make_request(40, params=params, max_tokens=3, prefix=list(preq.prompt_token_ids or []))
    good.s.add_request(dreq)
    good.run_until(lambda f: dreq.status == RequestStatus.RUNNING or dreq.is_finished(), timeout=10)
    assert good.slot(0, 0, dreq.request_id, 5, 3) == p.value(preq.prompt_token_ids[5], 5, 0, 3)
    good.run_until(lambda f: dreq.is_finished(), timeout=10)
    assert dreq.status == RequestStatus.FINISHED_LENGTH_CAPPED
    # Another job's decode (another secret) is refused; the load fails instead of reading.
    bad = engines("kv_consumer", secret_file=other)
    preq, params = prefill_and_params(p, 40)
    breq = make_request(40, params=params)
    bad.s.add_request(breq)
    bad.run_until(lambda f: breq.is_finished(), timeout=10)
    assert breq.status == RequestStatus.FINISHED_ERROR


@pytest.mark.parametrize("idle_wait_s", [5.0, 0.0])
def test_an_idle_step_waits_for_its_pull_and_reports_it(engines: Any, idle_wait_s: float) -> None:  # noqa: F811
    """A decode step with nothing to compute but a pull in flight waits for the pull (up to
    idle_wait_s) and reports it in that step; with 0 it returns at once and a later step does."""
    p = engines("kv_producer")
    # 64 tokens of KV are 8 KiB here: 8 chunks of 1 KiB, 0.1 s apart, so the pull takes ~0.8 s.
    d = engines("kv_consumer", idle_wait_s=idle_wait_s, chunk_bytes=1024, debug_chunk_delay_s=0.1)
    _preq, params = prefill_and_params(p, 64)
    dreq = make_request(64, params=params, max_tokens=1)
    d.s.add_request(dreq)
    reported: list[set[str]] = []
    orig = d.workers[0].get_transfer_results

    def spy(finished: set[str]) -> Any:
        res = orig(finished)
        reported.append(set(res.finished_recving or ()))
        return res

    d.workers[0].get_transfer_results = spy  # type: ignore[method-assign]
    t0 = time.monotonic()
    d.step()  # schedules the load: no tokens to compute, one pull in flight
    took = time.monotonic() - t0
    if idle_wait_s:
        assert reported == [{dreq.request_id}] and took >= 0.1, (reported, took)
    else:
        assert reported == [set()], reported  # the pull (8 chunks, 0.1 s each) is still going
        d.run_until(lambda f: any(dreq.request_id in r for r in reported), timeout=10)
    d.run_until(lambda f: dreq.is_finished(), timeout=10)


def test_decode_sent_before_prefill_finished_pulls_by_the_proxys_key(engines: Any) -> None:  # noqa: F811
    """The proxy's overlapped flow: decode gets the request (and allocates, and pulls) while
    prefill has not even scheduled it; its pull waits at prefill for the key's blocks."""
    p = engines("kv_producer")
    d = engines("kv_consumer")
    # What the proxy learned from an earlier answer of this prefill.
    kvt = p.s.vllm_config.kv_transfer_config
    assert kvt is not None
    endpoint = {"remote_engine_id": kvt.engine_id, "remote_host": "127.0.0.1", "remote_port": p.port, "tp_size": 1}
    key = "pd-overlapped-1"
    preq = make_request(150, params={"do_remote_decode": True, "pull_key": key}, max_tokens=1)
    dreq = make_request(
        150,
        params={
            "do_remote_prefill": True,
            "do_remote_decode": False,
            **endpoint,
            "remote_request_id": key,
            "pull_key": key,
        },
        max_tokens=3,
        prefix=list(preq.prompt_token_ids or []),
    )
    d.s.add_request(dreq)
    for _ in range(5):  # decode schedules the load and its pull goes out; prefill has nothing yet
        d.step()
    assert dreq.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    p.s.add_request(preq)
    (fin,) = p.run_until(lambda f: any(o.request_id == preq.request_id for o in f))
    assert fin.kv_transfer_params["remote_request_id"] == key
    p.step()  # the worker learns of the finished request: the waiting pull is served
    d.run_until(lambda f: dreq.status == RequestStatus.RUNNING or dreq.is_finished(), timeout=10)
    for layer in range(LAYERS):
        for pos in (0, 100, 149):
            for head in range(TOTAL_HEADS):
                want = p.value(preq.prompt_token_ids[pos], pos, layer, head)
                assert d.slot(0, layer, dreq.request_id, pos, head) == want, (layer, pos, head)
    d.run_until(lambda f: dreq.is_finished(), timeout=10)
    p.run_until(lambda f: not p.s.requests, timeout=10)  # acked under vLLM's id: freed
    assert_empty(p.s)
