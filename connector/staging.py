"""Chunk sources and sinks: the bytes of a transfer, in wire order, as batches of host memoryviews.

* Direct (CPU caches with dense blocks): views straight into the paged KV, so the
  socket reads and writes the cache itself; no copy in user space.
* Staged (CUDA, or CPU layouts with strided blocks): each chunk is gathered into
  a pinned host slot by a copy stream (D2H) while earlier chunks are on the wire,
  and received chunks are scattered to the device (H2D) while later chunks are
  still arriving. A ring of `depth` slots bounds memory and keeps both overlapped.

Waits on CUDA events use blocking-sync events in a helper thread, so no thread
spins and the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from connector.layout import PagedKV


def _batches(kv: PagedKV, kblocks: Sequence[int], max_bytes: int) -> list[list[memoryview]]:
    """Views of each layer, grouped into batches of about max_bytes (one vectored call each)."""
    out: list[list[memoryview]] = []
    for layer in range(kv.num_layers):
        batch: list[memoryview] = []
        size = 0
        for view in kv.host_runs(layer, kblocks, max_bytes):
            if batch and size + len(view) > max_bytes:
                out.append(batch)
                batch, size = [], 0
            batch.append(view)
            size += len(view)
        if batch:
            out.append(batch)
    return out


def direct_source(kv: PagedKV, kblocks: Sequence[int], max_bytes: int) -> AsyncIterator[list[memoryview]]:
    async def gen() -> AsyncIterator[list[memoryview]]:
        for batch in _batches(kv, kblocks, max_bytes):
            yield batch

    return gen()


def direct_sink(kv: PagedKV, kblocks: Sequence[int], max_bytes: int, corrupt: bool) -> AsyncIterator[list[memoryview]]:
    async def gen() -> AsyncIterator[list[memoryview]]:
        for batch in _batches(kv, kblocks, max_bytes):
            yield batch
        if corrupt and kblocks:
            for layer in range(kv.num_layers):
                last = kv.host_runs(layer, kblocks[-1:], max_bytes)[0]
                last[:] = bytes(len(last))

    return gen()


class Stager:
    """Pinned rings, copy streams and an event-wait thread for one worker's device."""

    def __init__(self, kv: PagedKV, chunk_bytes: int, depth: int, max_rings: int = 4) -> None:
        self.kv = kv
        self.cuda = kv.device.type == "cuda"
        # A chunk always holds at least one block.
        self.chunk_bytes = max(chunk_bytes, max(kv.block_bytes))
        self.depth = max(2, depth)
        # At most max_rings transfers stage at once; each ring is depth x chunk_bytes.
        self._free: asyncio.Queue[list[torch.Tensor]] | None = None
        self._max_rings = max_rings
        self._made = 0
        self._waiter = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pdbench-kv-sync")
        if self.cuda:
            self.d2h = torch.cuda.Stream(device=kv.device)
            self.h2d = torch.cuda.Stream(device=kv.device)

    def close(self) -> None:
        self._waiter.shutdown(wait=False, cancel_futures=True)

    async def _ring(self) -> list[torch.Tensor]:
        if self._free is None:
            self._free = asyncio.Queue()
        if self._free.empty() and self._made < self._max_rings:
            self._made += 1
            pin = self.cuda
            # Pinned allocation is slow: rings are made once and reused.
            return [torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=pin) for _ in range(self.depth)]
        return await self._free.get()

    def _give_back(self, ring: list[torch.Tensor]) -> None:
        assert self._free is not None
        self._free.put_nowait(ring)

    async def _wait(self, ev: Any) -> None:
        if ev is not None:
            await asyncio.get_running_loop().run_in_executor(self._waiter, ev.synchronize)

    def _plan(self, kblocks: Sequence[int]) -> list[tuple[int, int, int]]:
        """(layer, start, stop) over kblocks, each chunk at most chunk_bytes."""
        plan = []
        for layer, bb in enumerate(self.kv.block_bytes):
            per = max(1, self.chunk_bytes // bb)
            plan += [(layer, a, min(a + per, len(kblocks))) for a in range(0, len(kblocks), per)]
        return plan

    def _index(self, kblocks: Sequence[int], stream: Any) -> torch.Tensor:
        idx = torch.tensor(list(kblocks), dtype=torch.long)
        if not self.cuda:
            return idx
        with torch.cuda.stream(stream):
            return idx.pin_memory().to(self.kv.device, non_blocking=True)

    def _event(self, stream: Any) -> Any:
        ev = torch.cuda.Event(blocking=True)  # the waiting thread sleeps, it does not spin
        ev.record(stream)
        return ev

    async def source(self, kblocks: Sequence[int], ready: Any = None) -> AsyncIterator[list[memoryview]]:
        """Gather chunks device -> pinned, `depth` copies ahead of the socket."""
        kv, plan = self.kv, self._plan(kblocks)
        ring = await self._ring()
        try:
            stream = self.d2h if self.cuda else None
            if stream is not None and ready is not None:
                stream.wait_event(ready)  # KV written by the compute stream comes first
            idx = self._index(kblocks, stream)
            events: list[Any] = [None] * len(plan)

            def launch(k: int) -> None:
                layer, a, b = plan[k]
                t = kv.layers[layer]
                slot = ring[k % self.depth][: (b - a) * kv.block_bytes[layer]]
                dst = slot.view(t.dtype).view(b - a, *t.shape[1:])
                if self.cuda:
                    with torch.cuda.stream(stream):
                        dst.copy_(t.index_select(0, idx[a:b]), non_blocking=True)
                        events[k] = self._event(stream)
                else:
                    torch.index_select(t, 0, idx[a:b], out=dst)

            for k in range(min(self.depth, len(plan))):
                launch(k)
            for k, (layer, a, b) in enumerate(plan):
                await self._wait(events[k])
                yield [memoryview(ring[k % self.depth][: (b - a) * kv.block_bytes[layer]].numpy())]  # type: ignore[arg-type]
                # The consumer has sent slot k: refill it with chunk k + depth.
                if k + self.depth < len(plan):
                    launch(k + self.depth)
        finally:
            if self.cuda:
                await self._wait(self._event(self.d2h))  # no copy may still target the ring
            self._give_back(ring)

    async def sink(self, kblocks: Sequence[int], corrupt: bool = False) -> AsyncIterator[list[memoryview]]:
        """Receive chunks into pinned slots; scatter each to the device while the next arrives."""
        kv, plan = self.kv, self._plan(kblocks)
        ring = await self._ring()
        try:
            stream = self.h2d if self.cuda else None
            idx = self._index(kblocks, stream)
            slot_busy: list[Any] = [None] * self.depth
            for k, (layer, a, b) in enumerate(plan):
                s = k % self.depth
                await self._wait(slot_busy[s])
                slot = ring[s][: (b - a) * kv.block_bytes[layer]]
                yield [memoryview(slot.numpy())]  # type: ignore[arg-type]  # an ndarray is a buffer
                t = kv.layers[layer]
                src = slot.view(t.dtype).view(b - a, *t.shape[1:])
                if self.cuda:
                    with torch.cuda.stream(stream):
                        t.index_copy_(0, idx[a:b], src.to(kv.device, non_blocking=True))
                        slot_busy[s] = self._event(stream)
                else:
                    t.index_copy_(0, idx[a:b], src)
            if corrupt and len(kblocks):
                with torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext():
                    for t in kv.layers:
                        t.index_fill_(0, idx[-1:], 0)
        finally:
            if self.cuda:
                # Everything landed (or, on failure, stopped touching the ring) first.
                await self._wait(self._event(self.h2d))
            self._give_back(ring)
