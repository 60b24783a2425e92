"""PdbenchConnector's roles on real vLLM schedulers, with no model and no GPU.

The scheduler builders and requests of the scheduler tests, and the engines (a scheduler plus one
worker connector per TP rank over CPU tensors, fake forward) of the worker tests. Import it only
after `require_vllm(module_level=True)`: it imports vLLM.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import torch
from conftest import port_base
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from connector.connector import PdbenchConnector
from connector.heads import head_span

BS = 16

EOS = 0

NUM_BLOCKS = 200


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from harness.tiny_model import build

    return str(build(tmp_path_factory.mktemp("model") / "tiny"))


# vLLM's engine sets the block hashes' seed at start; the schedulers here have no engine, and a
# test module that makes them must not depend on another having set it first (each alone failed).
init_none_hash(sha256)


def make_scheduler(model_dir: str, role: str, policy: str = "fail", **extra: Any) -> Scheduler:
    vc = VllmConfig(
        model_config=ModelConfig(model=model_dir, dtype="float32", seed=0),
        scheduler_config=SchedulerConfig(
            max_num_seqs=16,
            max_num_batched_tokens=512,
            max_model_len=2048,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BS, cache_dtype="auto", enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector="PdbenchConnector",
            kv_connector_module_path="connector",
            kv_role=role,
            kv_load_failure_policy=policy,
            kv_connector_extra_config={"host": "p-host", "port": 15690, **extra},
        ),
        device_config=DeviceConfig("cpu"),
    )
    vc.cache_config.num_gpu_blocks = NUM_BLOCKS
    kcc = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"], FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
            )
        ],
    )
    return Scheduler(
        vllm_config=vc,
        kv_cache_config=kcc,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=BS,
    )


request_ids = itertools.count(1)


def make_request(
    num_tokens: int, *, params: dict[str, Any] | None = None, max_tokens: int = 4, prefix: list[int] | None = None
) -> Request:
    n = next(request_ids)
    prefix = prefix or []
    prompt = prefix + [(n * 7919 + i) % 2000 + 3 for i in range(num_tokens - len(prefix))]
    sp = SamplingParams(max_tokens=max_tokens)
    sp.update_from_generation_config({}, EOS)
    req = Request(
        request_id=f"req-{n}",
        prompt_token_ids=prompt,
        sampling_params=sp,
        pooling_params=None,
        mm_features=None,
        block_hasher=get_request_block_hasher(BS, sha256),
    )
    req.kv_transfer_params = params
    return req


def assert_empty(s: Scheduler) -> None:
    assert not s.requests and not s.waiting and not s.running
    assert not s.finished_recving_kv_req_ids and not s.failed_recving_kv_req_ids
    mgr = s.kv_cache_manager
    assert not mgr.coordinator.single_type_managers[0].req_to_blocks
    assert all(b.ref_cnt == 0 for b in mgr.block_pool.blocks)
    assert mgr.block_pool.free_block_queue.num_free_blocks == mgr.block_pool.num_gpu_blocks - 1


def finished_outputs(out: dict[int, Any]) -> list[Any]:
    return [o for outs in out.values() for o in outs.outputs if o.finish_reason is not None]


C, LAYERS = 8, 2

TOTAL_HEADS = 4  # the tiny model's KV heads; each rank holds its TP share (heads.head_span)


class Engine:
    def __init__(
        self,
        model_dir: str,
        role: str,
        port: int,
        tp: int = 1,
        policy: str = "fail",
        monkeypatch: pytest.MonkeyPatch | None = None,
        **extra: Any,
    ) -> None:
        extra = {"host": "127.0.0.1", "port": port, "io_timeout_s": 2.0, "register_timeout_s": 2.0, **extra}
        self.port = port
        self.s = make_scheduler(model_dir, role, policy, **extra)
        self.s.vllm_config.parallel_config.tensor_parallel_size = tp
        self.s.connector._sched.tp_size = tp  # type: ignore[union-attr]
        self.kv: list[dict[str, torch.Tensor]] = []
        self.spans = [head_span(r, tp, TOTAL_HEADS) for r in range(tp)]
        self.workers: list[PdbenchConnector] = []
        import vllm.distributed.parallel_state as ps

        assert monkeypatch is not None
        for rank in range(tp):
            monkeypatch.setattr(ps, "get_tensor_model_parallel_rank", lambda r=rank: r)
            w = PdbenchConnector(self.s.vllm_config, KVConnectorRole.WORKER, self.s.kv_cache_config)
            heads = self.spans[rank][1] - self.spans[rank][0]
            caches = {f"layers.{i}.attn": torch.zeros(NUM_BLOCKS, heads, BS, C) for i in range(LAYERS)}
            w.register_kv_caches(caches)
            self.kv.append(caches)
            self.workers.append(w)
        self.agg = KVOutputAggregator(tp)

    @staticmethod
    def value(token: int, pos: int, layer: int, head: int) -> float:
        """What the fake forward writes for the model's KV head `head` (exact in float32)."""
        return float((token % 997) * 16384 + pos * 8 + layer * 4 + head)

    def step(self) -> dict[int, Any]:
        so = self.s.schedule()
        outs = []
        for rank, w in enumerate(self.workers):
            w.bind_connector_metadata(so.kv_connector_metadata)
            for req_id, n in so.num_scheduled_tokens.items():  # fake forward: write this step's KV
                req = self.s.requests[req_id]
                blocks = self.s.kv_cache_manager.get_block_ids(req_id)[0]
                start = req.num_computed_tokens - n  # schedule() already advanced it
                for pos in range(start, start + n):
                    tok = req.all_token_ids[pos]
                    for li, t in enumerate(self.kv[rank].values()):
                        for h in range(t.shape[1]):
                            t[blocks[pos // BS], h, pos % BS, :] = self.value(tok, pos, li, self.spans[rank][0] + h)
            res = w.get_transfer_results(so.finished_req_ids)

            kvo = KVConnectorOutput(
                finished_sending=res.finished_sending,
                finished_recving=res.finished_recving,
                failed_recving=res.failed_recving,
                invalid_block_ids=w.get_block_ids_with_load_errors(),
                kv_connector_stats=w.get_kv_connector_stats(),
            )
            ids = list(so.num_scheduled_tokens)
            outs.append(
                ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: i for i, r in enumerate(ids)},
                    sampled_token_ids=[[5] for _ in ids],
                    logprobs=None,
                    prompt_logprobs_dict={},
                    pooler_output=None,
                    kv_connector_output=kvo,
                )
            )
            w.clear_connector_metadata()
        out = self.agg.aggregate(outs)
        assert out is not None
        return self.s.update_from_output(so, out)

    def run_until(self, cond: Any, timeout: float = 10.0) -> list[Any]:
        fin: list[Any] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            fin += finished_outputs(self.step())
            if cond(fin):
                return fin
            time.sleep(0.005)
        raise AssertionError("condition not reached")

    def slot(self, rank: int, layer: int, req_id: str, pos: int, head: int = 0) -> float:
        """Rank `rank`'s value of the model's KV head `head` (it must hold it)."""
        blocks = self.s.kv_cache_manager.get_block_ids(req_id)[0]
        t = list(self.kv[rank].values())[layer]
        return float(t[blocks[pos // BS], head - self.spans[rank][0], pos % BS, 0])

    def close(self) -> None:
        for w in self.workers:
            w.shutdown()


@pytest.fixture
def engines(model_dir: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    made: list[Engine] = []
    free, limit = port_base(15640), port_base(15660)

    def make(role: str, port: int | None = None, **k: Any) -> Engine:
        nonlocal free
        if port is None:  # a producer's rank r listens on port + r
            port, free = free, free + k.get("tp", 1)
            assert free <= limit, "out of test KV ports"
        e = Engine(model_dir, role, port, monkeypatch=monkeypatch, **k)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def prefill_and_params(p: Engine, n_tokens: int, prefix: list[int] | None = None) -> tuple[Any, dict[str, Any]]:
    req = make_request(n_tokens, params={"do_remote_decode": True}, max_tokens=1, prefix=prefix)
    p.s.add_request(req)
    (fin,) = p.run_until(lambda f: any(o.request_id == req.request_id for o in f))
    p.step()  # as the engine does (it keeps stepping while blocks are held): the worker learns of it
    return req, fin.kv_transfer_params
