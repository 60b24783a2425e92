"""PdbenchConnector: the vLLM V1 KV connector class (one instance per role and process).

Flow (the NIXL two-phase flow, so an unchanged NIXL-style proxy drives it):
  1. proxy -> prefill, ``kv_transfer_params: {do_remote_decode: true}``, max_tokens 1;
  2. prefill finishes, keeps the blocks, answers with ``kv_transfer_params``
     (engine id, request id, host, port, token count);
  3. proxy -> decode with those params; decode allocates blocks, its worker pulls
     the KV over TCP layer by layer straight into them, acks, and the request
     runs; prefill frees its blocks on the ack (or at lease expiry).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from connector.config import PdbenchConfig
from connector.metadata import PdbenchMetadata
from connector.scheduler import PdbenchScheduler
from connector.stats import PdbenchPromMetrics, PdbenchStats
from connector.vllm_compat import TransferResults, p2p_cache_hit_source
from connector.worker import PdbenchWorker

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


class PdbenchConnector(KVConnectorBase_V1):
    _cache_hit_source = p2p_cache_hit_source()  # read by vLLM >= 0.32 only

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        assert self._kv_transfer_config is not None
        cfg = PdbenchConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        if len(kv_cache_config.kv_cache_groups) > 1:
            raise ValueError(
                "PdbenchConnector supports one KV cache group (full attention); "
                "hybrid models need --disable-hybrid-kv-cache-manager"
            )
        self._sched: PdbenchScheduler | None = None
        self._worker: PdbenchWorker | None = None
        self._bad_blocks: set[int] = set()
        if role == KVConnectorRole.SCHEDULER:
            self._sched = PdbenchScheduler(vllm_config, cfg)
        else:
            self._worker = PdbenchWorker(vllm_config, kv_cache_config, cfg)

    # -- worker side ------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        # Start transfers now rather than in start_load_kv, which vLLM runs after
        # the forward pass for asynchronous loads.
        if self._worker is not None and isinstance(connector_metadata, PdbenchMetadata):
            self._worker.start(connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return  # loads are asynchronous and already started in bind_connector_metadata

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # a request runs only after its whole load finished (WAITING_FOR_REMOTE_KVS)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        # Each layer's KV is written in place into blocks that stay held until the
        # decode side acks, and streamed from there layer by layer: nothing to copy here.
        return

    def wait_for_save(self) -> None:
        return

    def get_transfer_results(self, finished_req_ids: set[str]) -> TransferResults:
        # finished_req_ids needs no tracking: a send is registered only once its
        # request finished, in the same step the engine reports it finished.
        if self._worker is None:
            return TransferResults()
        sent, recvd, failed, bad = self._worker.results()
        self._bad_blocks |= bad
        return TransferResults(finished_sending=sent, finished_recving=recvd, failed_recving=failed)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        bad, self._bad_blocks = self._bad_blocks, set()
        return bad

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._worker is None:
            return None
        s = self._worker.stats()
        return None if s is None else PdbenchStats(data=s.as_dict())

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()

    # -- scheduler side -------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self._sched is not None
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        assert self._sched is not None
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._sched is not None
        return self._sched.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        assert self._sched is not None
        self._sched.update_connector_output(connector_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._sched is not None
        return self._sched.request_finished(request, block_ids)

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        return (0,)  # we transfer the request's own blocks of the single group

    # -- class-level hooks (the frontend rebuilds stats and metrics through these) ----

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return PdbenchStats(data=data) if data is not None else PdbenchStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return PdbenchPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
