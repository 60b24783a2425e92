"""Chunk sources and sinks: the bytes of a transfer, in wire order, as batches of host memoryviews.

* Direct (CPU caches with dense blocks): views straight into the paged KV, so the
  socket reads and writes the cache itself; no copy in user space.
* Staged (CUDA, or CPU layouts with strided blocks): each chunk is gathered into
  a pinned host slot by a copy stream (D2H) while earlier chunks are on the wire,
  and received chunks are scattered to the device (H2D) while later chunks are
  still arriving. A ring of `depth` slots bounds memory and keeps both overlapped.
* Device to device (CUDA IPC, connector/ipc.py): prefill's blocks, opened on this
  GPU, are gathered straight into ours on the inbound stream; no host memory.

Waits on CUDA events use blocking-sync events in a helper thread, so no thread
spins and the event loop never blocks. Every wait is bounded: a chunk's copy, a free
ring and prefill's `ready` by `wait_s` (the connector's io_timeout_s), a whole-transfer
device copy by `wait_s` plus its size at a floor rate, so a stuck GPU or a starved ring
fails the transfer with StagingTimeout instead of holding it forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from array import array
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from connector.layout import Heads, PagedKV

log = logging.getLogger(__name__)

# The slowest device copy counted as progress (pageable host memory still copies well
# above this): a copy of N bytes may take wait_s + N / this before it counts as stuck.
SLOWEST_COPY_BPS = 1e9


class StagingTimeout(TimeoutError):
    """A device copy, prefill's KV or a staging ring was not ready within its bound."""


def _batches(kv: PagedKV, kblocks: Sequence[int], max_bytes: int, heads: Heads | None) -> list[list[memoryview]]:
    """Views of each layer, grouped into batches of about max_bytes (one vectored call each)."""
    out: list[list[memoryview]] = []
    for layer in range(kv.num_layers):
        batch: list[memoryview] = []
        size = 0
        for view in kv.host_runs(layer, kblocks, max_bytes, heads):
            if batch and size + len(view) > max_bytes:
                out.append(batch)
                batch, size = [], 0
            batch.append(view)
            size += len(view)
        if batch:
            out.append(batch)
    return out


def direct_source(
    kv: PagedKV, kblocks: Sequence[int], max_bytes: int, heads: Heads | None = None
) -> AsyncIterator[list[memoryview]]:
    async def gen() -> AsyncIterator[list[memoryview]]:
        for batch in _batches(kv, kblocks, max_bytes, heads):
            yield batch

    return gen()


def direct_sink(
    kv: PagedKV, kblocks: Sequence[int], max_bytes: int, corrupt: bool, heads: Heads | None = None
) -> AsyncIterator[list[memoryview]]:
    async def gen() -> AsyncIterator[list[memoryview]]:
        for batch in _batches(kv, kblocks, max_bytes, heads):
            yield batch
        if corrupt and kblocks:
            for layer in range(kv.num_layers):
                last = kv.host_runs(layer, kblocks[-1:], max_bytes, heads)[0]
                last[:] = bytes(len(last))

    return gen()


_SAME_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _wide_pair(src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both blocks' bytes as the widest integers alignment allows, trailing dims merged where
    both are dense across them: copy kernels then move few wide elements, bit for bit."""
    inner, ss, ds = list(src.shape[1:]), list(src.stride()), list(dst.stride())
    while len(inner) > 1 and ss[-2] == inner[-1] * ss[-1] and ds[-2] == inner[-1] * ds[-1]:
        inner[-2:], ss[-2:], ds[-2:] = [inner[-2] * inner[-1]], [ss[-1]], [ds[-1]]
    es = src.element_size()
    width = es
    if ss[-1] == 1 and ds[-1] == 1:
        offsets = (inner[-1], src.storage_offset(), dst.storage_offset(), *ss[:-1], *ds[:-1])
        width = next((w for w in (8, 4, 2) if w > es and all(x * es % w == 0 for x in offsets)), es)
    if width == es:
        return src.view(_SAME_WIDTH[es]), dst.view(_SAME_WIDTH[es])
    as_int = _SAME_WIDTH[width]
    return (
        src.as_strided([src.shape[0], *inner], ss).view(as_int),
        dst.as_strided([dst.shape[0], *inner], ds).view(as_int),
    )


class Stager:
    """Pinned rings, copy streams and an event-wait thread for one worker's device."""

    def __init__(self, kv: PagedKV, chunk_bytes: int, depth: int, max_rings: int = 4, wait_s: float = 20.0) -> None:
        self.kv = kv
        self.wait_s = wait_s
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
        self._ready_stream: Any = None

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
        try:
            # Every ring is held by a transfer whose own waits are bounded; a peer gives up
            # after io_timeout_s without progress anyway.
            return await asyncio.wait_for(self._free.get(), self.wait_s)
        except TimeoutError:
            raise StagingTimeout(
                f"no staging ring free within {self.wait_s:g} s ({self._max_rings} transfers staging)"
            ) from None

    async def _give_back(self, ring: list[torch.Tensor], stream: Any, what: str) -> None:
        """Return `ring` once no copy on `stream` can still touch it; a ring whose copies
        stalled is dropped (a new one may be made), never handed to another transfer."""
        if self.cuda:
            try:
                await self._wait(self._event(stream), f"{what} copies leaving the ring")
            except StagingTimeout:
                self._made -= 1
                log.error("pdbench: staging ring dropped: its %s copies did not finish", what)
                raise
        assert self._free is not None
        self._free.put_nowait(ring)

    async def _wait(self, ev: Any, what: str, nbytes: int = 0) -> None:
        """Until `ev` completed, at most wait_s plus nbytes at the slowest copy rate."""
        if ev is None:
            return
        limit = self.wait_s + nbytes / SLOWEST_COPY_BPS
        done = asyncio.get_running_loop().run_in_executor(self._waiter, ev.synchronize)
        try:
            await asyncio.wait_for(done, limit)
        except TimeoutError:
            # The waiting thread stays blocked in synchronize; the transfer fails now.
            raise StagingTimeout(f"{what} did not complete within {limit:.1f} s (GPU stuck?)") from None

    async def wait_ready(self, ready: Any) -> None:
        """Returns once `ready` (recorded after the kernels that wrote the KV) completed."""
        if not self.cuda or ready is None or ready.query():
            return
        if self._ready_stream is None:
            self._ready_stream = torch.cuda.Stream(device=self.kv.device)
        # `ready` may spin when synchronized; a blocking event behind it sleeps instead.
        self._ready_stream.wait_event(ready)
        await self._wait(self._event(self._ready_stream), "prefill's KV (its ready event)")

    def _plan(self, kblocks: Sequence[int], heads: Heads | None) -> list[tuple[int, int, int]]:
        """(layer, start, stop) over kblocks, each chunk at most chunk_bytes."""
        plan = []
        for layer in range(self.kv.num_layers):
            per = max(1, self.chunk_bytes // self.kv.unit_bytes(layer, heads))
            plan += [(layer, a, min(a + per, len(kblocks))) for a in range(0, len(kblocks), per)]
        return plan

    def _index(self, kblocks: Sequence[int], stream: Any) -> torch.Tensor:
        if not self.cuda:
            return torch.tensor(list(kblocks), dtype=torch.long)
        if not kblocks:
            return torch.empty(0, dtype=torch.long, device=self.kv.device)
        # Through array('q'): torch.tensor(list) costs ~160 us per 2k ids, this ~40 us.
        idx = torch.frombuffer(array("q", kblocks), dtype=torch.long)
        with torch.cuda.stream(stream):
            return idx.pin_memory().to(self.kv.device, non_blocking=True)

    def _event(self, stream: Any) -> Any:
        ev = torch.cuda.Event(blocking=True)  # the waiting thread sleeps, it does not spin
        ev.record(stream)
        return ev

    def _layer(self, layer: int, heads: Heads | None) -> torch.Tensor:
        t = self.kv.layers[layer]
        return t if self.kv.is_whole(heads) else t[:, heads[0] : heads[1]]  # type: ignore[index]  # not whole: a range

    async def source(
        self, kblocks: Sequence[int], ready: Any = None, heads: Heads | None = None
    ) -> AsyncIterator[list[memoryview]]:
        """Gather chunks device -> pinned, `depth` copies ahead of the socket."""
        kv, plan = self.kv, self._plan(kblocks, heads)
        ring = await self._ring()
        try:
            stream = self.d2h if self.cuda else None
            if stream is not None and ready is not None:
                stream.wait_event(ready)  # KV written by the compute stream comes first
            idx = self._index(kblocks, stream)
            events: list[Any] = [None] * len(plan)

            def launch(k: int) -> None:
                layer, a, b = plan[k]
                t = self._layer(layer, heads)
                slot = ring[k % self.depth][: (b - a) * kv.unit_bytes(layer, heads)]
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
                await self._wait(events[k], f"D2H copy of chunk {k + 1} of {len(plan)}", self.chunk_bytes)
                yield [memoryview(ring[k % self.depth][: (b - a) * kv.unit_bytes(layer, heads)].numpy())]  # type: ignore[arg-type]
                # The consumer has sent slot k: refill it with chunk k + depth.
                if k + self.depth < len(plan):
                    launch(k + self.depth)
        finally:
            await self._give_back(ring, self.d2h if self.cuda else None, "D2H")  # no copy may still target it

    async def sink(
        self, kblocks: Sequence[int], corrupt: bool = False, heads: Heads | None = None
    ) -> AsyncIterator[list[memoryview]]:
        """Receive chunks into pinned slots; scatter each to the device while the next arrives."""
        kv, plan = self.kv, self._plan(kblocks, heads)
        ring = await self._ring()
        try:
            stream = self.h2d if self.cuda else None
            idx = self._index(kblocks, stream)
            slot_busy: list[Any] = [None] * self.depth
            for k, (layer, a, b) in enumerate(plan):
                s = k % self.depth
                await self._wait(slot_busy[s], f"H2D copy out of ring slot {s}", self.chunk_bytes)
                slot = ring[s][: (b - a) * kv.unit_bytes(layer, heads)]
                yield [memoryview(slot.numpy())]  # type: ignore[arg-type]  # an ndarray is a buffer
                t = self._layer(layer, heads)
                src = slot.view(t.dtype).view(b - a, *t.shape[1:])
                if self.cuda:
                    with torch.cuda.stream(stream):
                        t.index_copy_(0, idx[a:b], src.to(kv.device, non_blocking=True))
                        slot_busy[s] = self._event(stream)
                else:
                    t.index_copy_(0, idx[a:b], src)
            if corrupt and len(kblocks):
                with torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext():
                    for layer in range(kv.num_layers):
                        self._layer(layer, heads).index_fill_(0, idx[-1:], 0)
        finally:
            # Everything landed (or, on failure, stopped touching the ring) first.
            await self._give_back(ring, self.h2d if self.cuda else None, "H2D")

    def plan(self, layers: Sequence[torch.Tensor]) -> Any:
        """How copy_from moves blocks of `layers` (a source on this device) into ours; made once."""
        from connector import gather  # imports Triton: only where CUDA IPC is used

        return gather.make_plan([_wide_pair(src, dst) for src, dst in zip(layers, self.kv.layers, strict=True)])

    async def copy_from(
        self,
        plan: Any,
        src_blocks: Sequence[int],
        dst_blocks: Sequence[int],
        corrupt: bool = False,
        delay_s: float = 0.0,
    ) -> int:
        """Gather `src_blocks` of the plan's source into our `dst_blocks`; returns the bytes
        moved, once they landed."""
        from connector import gather

        n, stream, layers = len(dst_blocks), self.h2d, self.kv.num_layers
        if n and not (min(dst_blocks) >= 0 and max(dst_blocks) < self.kv.layers[0].shape[0]):
            raise ValueError("destination block outside this cache")
        idx = self._index([*src_blocks, *dst_blocks], stream)
        sidx, didx = idx[:n], idx[n:]
        # Every layer in one go; a debug delay paces them one by one instead.
        groups = [(i, i + 1) for i in range(layers)] if delay_s else [(0, layers)]
        try:
            for lo, hi in groups:
                with torch.cuda.stream(stream):
                    gather.launch(plan, lo, hi, sidx, didx, self.chunk_bytes)
                if delay_s:
                    await asyncio.sleep(delay_s)
            if corrupt and n:
                with torch.cuda.stream(stream):
                    for t in self.kv.layers:
                        t.index_fill_(0, didx[-1:], 0)
        finally:
            # Landed (or, on failure, stopped reading the source) before the ack or the error.
            await self._wait(self._event(stream), f"device copy of {n} blocks", n * sum(self.kv.block_bytes))
        return n * sum(self.kv.block_bytes)
