"""Scheduler side (EngineCore process): who sends, who pulls, what the client is told.

Prefill (request carries ``do_remote_decode``): when it finishes, keep its blocks
(`request_finished` returns True), tell the worker to hold them under a lease,
and return the ``kv_transfer_params`` the decode instance needs. Decode (request
carries ``do_remote_prefill``): claim the prompt tokens not cached locally as an
asynchronous load, then hand the worker the blocks to fill. Everything else
about lifetimes (freeing on ``finished_sending`` / ``finished_recving``, load
failure policy) is the engine's own, driven by what the worker reports.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from connector.config import PdbenchConfig
from connector.metadata import FirstStep, PdbenchMetadata, RecvSpec, ReleaseSpec, SendSpec

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

_REMOTE_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


def _ms(a: float, b: float) -> float:
    return round((b - a) * 1000.0, 4)


@dataclass
class _Timed:
    """A timed request's moments on this process's clock (connector/timings.py)."""

    pdbench_id: str
    seen: float  # first asked for its remote tokens
    alloc: float | None = None  # its blocks allocated, the load handed to the worker
    ready: float | None = None  # the worker reported the load finished


class PdbenchScheduler:
    def __init__(self, vllm_config: VllmConfig, cfg: PdbenchConfig) -> None:
        kvt = vllm_config.kv_transfer_config
        assert kvt is not None and kvt.engine_id is not None
        par = vllm_config.parallel_config
        self.cfg = cfg
        self.engine_id: str = kvt.engine_id
        self.block_size: int = vllm_config.cache_config.block_size
        self.tp_size: int = par.tensor_parallel_size
        self.host = cfg.advertised_host()
        self.port = cfg.listen_port(par.data_parallel_index, par.tensor_parallel_size, 0)
        self._meta = PdbenchMetadata()
        # Timed requests by vLLM id, from the first ask until their first step (or their end).
        self._timed: dict[str, _Timed] = {}

    # -- decode: loads ------------------------------------------------------------

    @staticmethod
    def _remote(request: Request) -> dict[str, Any] | None:
        p = request.kv_transfer_params
        if not p or not p.get("do_remote_prefill"):
            return None
        if not all(p.get(k) is not None for k in _REMOTE_KEYS):
            log.warning(
                "pdbench: request %s has incomplete kv_transfer_params %s; computing locally", request.request_id, p
            )
            return None
        return p

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        p = self._remote(request)
        if p is None:
            return 0, False
        available = len(request.prompt_token_ids or [])
        remote = p.get("remote_num_tokens")
        if isinstance(remote, int) and remote >= 0:
            available = min(available, remote)
        count = available - num_computed_tokens
        if count <= 0:
            return 0, False
        tag = p.get("pdbench_id")
        if self.cfg.timings_dir and isinstance(tag, str) and request.request_id not in self._timed:
            self._timed[request.request_id] = _Timed(tag, time.perf_counter())
        return count, True

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        p = self._remote(request)
        if p is None:
            return
        p["do_remote_prefill"] = False  # one transfer per request, even if called again
        timed = self._timed.get(request.request_id)
        if num_external_tokens <= 0:
            # Everything is cached here already: prefill can drop its copy now.
            self._meta.releases.append(self._release_spec(p))
            self._timed.pop(request.request_id, None)  # no load to time
            return
        if timed is not None:
            timed.alloc = time.perf_counter()
        group = blocks.blocks[0]
        cached = sum(1 for b in group if b.block_hash is not None)
        first_token = cached * self.block_size
        num_tokens = first_token + num_external_tokens
        new_ids = [b.block_id for b in group[cached:]]
        need = -(-num_tokens // self.block_size) - cached
        self._meta.recvs.append(
            RecvSpec(
                req_id=request.request_id,
                remote_req_id=str(p["remote_request_id"]),
                remote_engine_id=str(p["remote_engine_id"]),
                remote_host=str(p["remote_host"]),
                remote_port=int(p["remote_port"]),
                remote_tp_size=int(p.get("tp_size") or 1),
                first_token=first_token,
                num_tokens=num_tokens,
                block_ids=new_ids[:need],
                early=bool(p.get("pull_key")),
                pdbench_id=None if timed is None else timed.pdbench_id,
                queue_ms=None if timed is None or timed.alloc is None else _ms(timed.seen, timed.alloc),
            )
        )

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """Notes when a timed request's load was reported finished (the worker's last step)."""
        if not self._timed:
            return
        now = time.perf_counter()
        for req_id in output.finished_recving or ():
            timed = self._timed.get(req_id)
            if timed is not None and timed.alloc is not None and timed.ready is None:
                timed.ready = now

    @staticmethod
    def _release_spec(p: dict[str, Any]) -> ReleaseSpec:
        return ReleaseSpec(
            str(p["remote_request_id"]),
            str(p["remote_engine_id"]),
            str(p["remote_host"]),
            int(p["remote_port"]),
            int(p.get("tp_size") or 1),
        )

    # -- prefill: sends -------------------------------------------------------------

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        from vllm.v1.request import RequestStatus

        self._timed.pop(request.request_id, None)  # ended before its first step (abort)
        p = request.kv_transfer_params
        if not p:
            return False, None
        if p.get("do_remote_prefill"):
            # Decode request that ended before its load was scheduled (abort, rejection).
            p["do_remote_prefill"] = False
            if self._remote_complete(p):
                self._meta.releases.append(self._release_spec(p))
            return False, None
        if not p.get("do_remote_decode"):
            return False, None
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED):
            return False, None  # aborted prefill: nothing will be pulled
        if not block_ids:
            return False, None
        # The proxy's overlapped flow names the blocks with a key it gave decode too.
        key = p.get("pull_key") if isinstance(p.get("pull_key"), str) and p.get("pull_key") else None
        self._meta.sends.append(SendSpec(request.request_id, list(block_ids), key))
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_request_id": key or request.request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_block_ids": list(block_ids),
            "remote_num_tokens": request.num_computed_tokens,
            "tp_size": self.tp_size,
            "transfer_mode": "pull",
            "connector": "pdbench",
        }

    @staticmethod
    def _remote_complete(p: dict[str, Any]) -> bool:
        return all(p.get(k) is not None for k in _REMOTE_KEYS)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> PdbenchMetadata:
        meta, self._meta = self._meta, PdbenchMetadata()
        meta.idle = scheduler_output.total_num_scheduled_tokens == 0
        if self._timed:
            now, scheduled = time.perf_counter(), scheduler_output.num_scheduled_tokens
            for req_id, t in list(self._timed.items()):
                if t.ready is not None and t.alloc is not None and req_id in scheduled:
                    # Its first step since the load: the worker times it and writes the line.
                    meta.first_steps[req_id] = FirstStep(_ms(t.alloc, t.ready), _ms(t.ready, now))
                    del self._timed[req_id]
        return meta
