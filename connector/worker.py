"""Worker side (one per TP rank): runs the transfers of this rank's KV shard.

Prefill ranks serve their own shard on `port + rank`. With equal TP sizes decode
rank r pulls whole blocks from prefill rank r; otherwise each decode rank pulls the
KV heads it holds from the prefill ranks that hold them (connector/heads.py). Every
rank reports its own completions (vLLM's aggregator waits for all ranks). Work starts as soon as the
step's metadata is bound, before the forward pass, so transfers overlap compute.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import torch

from connector import heads
from connector.config import PdbenchConfig
from connector.layout import PagedKV
from connector.metadata import FirstStep, PdbenchMetadata, RecvSpec
from connector.staging import Stager
from connector.timings import TimingsFile
from connector.transport import Completions, IOLoop, KVClient, KVServer, PullJob, PullTiming, TransferStats

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

log = logging.getLogger(__name__)

_TIMED_MAX = 4096  # timed loads awaiting their first step (an aborted one never has it)


class PdbenchWorker:
    def __init__(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, cfg: PdbenchConfig) -> None:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        kvt = vllm_config.kv_transfer_config
        assert kvt is not None and kvt.engine_id is not None
        par = vllm_config.parallel_config
        self.cfg = cfg
        self.engine_id: str = kvt.engine_id
        self.producer, self.consumer = kvt.is_kv_producer, kvt.is_kv_consumer
        self.tp_rank: int = get_tensor_model_parallel_rank()
        self.tp_size: int = par.tensor_parallel_size
        self.port = cfg.listen_port(par.data_parallel_index, self.tp_size, self.tp_rank)
        self.block_size: int = vllm_config.cache_config.block_size
        model = vllm_config.model_config
        # An MLA cache holds one latent "head", the same on every rank.
        self.total_heads: int = 1 if model.use_mla else model.get_total_num_kv_heads()
        self.num_blocks: int = kv_cache_config.num_blocks
        self.single_group = len(kv_cache_config.kv_cache_groups) == 1
        self.done = Completions()
        self.kv: PagedKV | None = None
        self.io: IOLoop | None = None
        self.server: KVServer | None = None
        self.client: KVClient | None = None
        self.stager: Stager | None = None
        self._pulls: set[concurrent.futures.Future[bool]] = set()
        self._idle = False
        # Per-request timings (connector/timings.py): decode's rank 0 writes them.
        self.timings: TimingsFile | None = None
        self._timed: OrderedDict[str, RecvSpec] = OrderedDict()  # timed loads by vLLM id
        self._loaded: dict[str, tuple[bool, list[PullTiming]]] = {}  # their outcomes
        self._step_start = 0.0
        self._first_steps: dict[str, FirstStep] = {}

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        kv = PagedKV(kv_caches, self.num_blocks, self.block_size, self.total_heads)
        self.kv = kv
        cfg = self.cfg
        self.stager = (
            None if kv.host_direct else Stager(kv, cfg.chunk_bytes, cfg.pipeline_depth, wait_s=cfg.io_timeout_s)
        )
        # Created here, on the model thread after vLLM pinned it, so the IO thread
        # shares its cores instead of competing with a neighbouring instance.
        self.io = IOLoop(f"pdbench-kv-{self.tp_rank}", self.cfg.io_nice)
        if self.producer:
            self.server = KVServer(kv, self.stager, self.cfg, self.engine_id, self.port, self.done)
            self.io.submit(self.server.start()).result(30)
        if self.consumer:
            self.client = KVClient(kv, self.stager, self.cfg, self.done)
            if cfg.timings_dir and self.tp_rank == 0:
                self.timings = TimingsFile(cfg.timings_dir)
        log.info(
            "pdbench connector rank %d: %d layers, kernel block %d tokens, %s path, %s",
            self.tp_rank,
            kv.num_layers,
            kv.kernel_block_size,
            "zero-copy" if kv.host_direct else f"staged ({kv.device.type})",
            f"serving on {self.cfg.listen_host()}:{self.port}" if self.producer else "pulling",
        )
        if self.server is not None:
            log.info("pdbench connector rank %d: CUDA IPC %s", self.tp_rank, "offered" if self.server.ipc else "off")

    def start(self, meta: PdbenchMetadata) -> None:
        """Hand this step's sends, pulls and releases to the IO thread (non-blocking)."""
        self._idle = meta.idle
        if self.timings is not None:
            self._step_start, self._first_steps = time.perf_counter(), meta.first_steps
        if self.io is None or self.kv is None:
            return
        if meta.sends:
            assert self.server is not None, "a producer request reached a non-producer worker"
            ready = None
            if self.kv.device.type == "cuda":
                # Orders the staging copies after every kernel that wrote this KV.
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(self.kv.device))
            for s in meta.sends:
                self.io.call(self.server.register, s.req_id, self.kv.kblocks(s.block_ids), ready, s.key)
        for r in meta.recvs:
            self._pull(r)
        for rel in meta.releases:
            if self.client is not None:
                for rank in self._ranks_of(rel.remote_tp_size):
                    self.io.submit(
                        self.client.release(
                            rel.remote_host, rel.remote_port + rank, rel.remote_engine_id, rel.remote_req_id
                        )
                    )

    def _plan(self, remote_tp: int) -> tuple[list[heads.Source], list[int]]:
        """This rank's pulls from a prefill of TP `remote_tp`, and the prefill ranks it releases."""
        assert self.kv is not None
        return heads.plan_for_cache(self.tp_rank, self.tp_size, remote_tp, self.total_heads, self.kv.heads)

    def _ranks_of(self, remote_tp: int) -> list[int]:
        """The prefill ranks this rank tells about a request: those it pulls from or releases."""
        try:
            pulls, idle = self._plan(remote_tp)
        except ValueError:
            return [self.tp_rank % remote_tp]
        return sorted({s.rank for s in pulls} | set(idle))

    def _pull(self, r: RecvSpec) -> None:
        assert self.io is not None and self.kv is not None
        try:
            if self.client is None:
                raise ValueError("this instance is not a KV consumer")
            pulls, idle = self._plan(r.remote_tp_size)
        except ValueError as exc:
            log.error(
                "pdbench: cannot load %s (prefill TP %d, decode TP %d): %s",
                r.req_id,
                r.remote_tp_size,
                self.tp_size,
                exc,
            )
            self.done.received(r.req_id, False, r.block_ids)
            return
        assert self.client is not None
        if self.timings is not None and r.pdbench_id is not None:
            self._timed[r.req_id] = r
            while len(self._timed) > _TIMED_MAX:
                self._loaded.pop(self._timed.popitem(last=False)[0], None)
        kbs = self.kv.kernel_block_size
        first = r.first_token // kbs
        count = -(-r.num_tokens // kbs) - first
        kblocks = self.kv.kblocks(r.block_ids)[:count]
        jobs = [
            PullJob(
                req_id=r.req_id,
                remote_req_id=r.remote_req_id,
                remote_engine_id=r.remote_engine_id,
                host=r.remote_host,
                port=r.remote_port + s.rank,
                first=first,
                kblocks=kblocks,
                block_ids=r.block_ids,
                heads=None if s.whole else s.remote,
                local_heads=None if s.whole else s.local,
                reader=s.reader,
                readers=s.readers,
                wait_s=self.cfg.early_wait_s if r.early else None,
            )
            for s in pulls
        ]
        for rank in idle:  # holds heads no decode rank reads: free them now
            self.io.submit(
                self.client.release(r.remote_host, r.remote_port + rank, r.remote_engine_id, r.remote_req_id)
            )
        self._pulls.add(self.io.submit(self.client.pull_all(jobs)))

    def results(self) -> tuple[set[str], set[str], set[str], set[int]]:
        step_end = time.perf_counter()  # after the step's forward (vLLM calls this then)
        if self._idle and self._pulls and self.cfg.idle_wait_s > 0:
            # Nothing else to do this step: block (GIL released) until a pull ends, so it is
            # reported now rather than a step later, and vLLM's model thread, which otherwise
            # spins between steps, leaves the core to the IO thread doing the pull.
            concurrent.futures.wait(self._pulls, self.cfg.idle_wait_s, concurrent.futures.FIRST_COMPLETED)
        self._pulls = {f for f in self._pulls if not f.done()}
        sent, recvd, failed, bad = self.done.drain()
        pulled = self.done.drain_pulls()
        if self.timings is not None:
            self._record(pulled, step_end)
        # Block ids only identify a block within one KV cache group; with several,
        # the per-request `failed` set alone carries the failure.
        return sent, recvd, failed, bad if self.single_group else set()

    def _record(self, pulled: dict[str, tuple[bool, list[PullTiming]]], step_end: float) -> None:
        """Keeps the timed loads' outcomes; writes the line of each request whose first step ran."""
        assert self.timings is not None
        self._loaded.update((req_id, v) for req_id, v in pulled.items() if req_id in self._timed)
        for req_id, first in self._first_steps.items():
            spec, loaded = self._timed.pop(req_id, None), self._loaded.pop(req_id, None)
            if spec is not None and loaded is not None:
                self.timings.write(timing_line(spec, first, loaded, step_end - self._step_start))
        self._first_steps = {}

    def stats(self) -> TransferStats | None:
        return self.done.drain_stats()

    def shutdown(self) -> None:
        if self.io is not None:
            self.io.stop()
            self.io = None
        if self.client is not None:
            self.client.close()
        if self.stager is not None:
            self.stager.close()
        if self.timings is not None:
            self.timings.close()


def timing_line(
    spec: RecvSpec, first: FirstStep, loaded: tuple[bool, list[PullTiming]], step_s: float
) -> dict[str, Any]:
    """One request's line (fields: connector/timings.py); the pulls' fields are None if all failed."""
    ok, pulls = loaded
    ms = lambda s: round(s * 1000.0, 4)  # noqa: E731
    return {
        "id": spec.pdbench_id,
        "req": spec.req_id,
        "queue_ms": spec.queue_ms,
        "load_ms": first.load_ms,
        "pull_ms": ms(max(p.pull_s for p in pulls)) if pulls else None,
        "pull_wait_ms": ms(max(p.wait_s for p in pulls)) if pulls else None,
        "ready_ms": first.ready_ms,
        "first_step_ms": ms(step_s),
        "bytes": sum(p.nbytes for p in pulls),
        "blocks": len(spec.block_ids),
        "path": "ipc" if pulls and all(p.via_ipc for p in pulls) else "tcp",
        "early": spec.early,
        "ok": ok,
    }
