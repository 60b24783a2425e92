"""The paged KV of one worker, addressed by kernel block, and its zero-copy host views.

vLLM 0.32 hands each layer's cache as a view with blocks on dim 0 (``[B, H, N, C]``);
vLLM 0.20 on CUDA hands ``[2, B, N, H, C]``, shown here as ``[B, H, 2, N, C]`` (blocks_first). The scheduler's block may span several kernel blocks (virtual block
splitting); we transfer in kernel blocks, so two instances whose scheduler block
sizes differ still interoperate when their kernel blocks match. On the wire a
block is its elements in C order, whatever the strides, so CPU and CUDA peers and
different physical layouts agree.

When prefill and decode TP sizes differ, a pull moves a range of KV heads (dim 1 of
vLLM's logical [B, H, N, C] layer view) of each block: on the wire, each block's
heads [a, b) in C order (connector/heads.py decides which).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def _block_contiguous(t: torch.Tensor) -> bool:
    """True when each t[i] is one dense C-order run (the block dim may be strided)."""
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:]), strict=False):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


Heads = tuple[int, int]  # a range [a, b) of a rank's own KV heads


def blocks_first(t: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """A layer's cache with blocks on dim 0 and KV heads on dim 1, as this module addresses it.

    vLLM 0.20's CUDA attention backends (FlashAttention, FlashInfer, Triton) hand
    ``[2, B, N, H, C]``: the K and V planes first. That layer is shown as the view
    ``[B, H, 2, N, C]`` (no copy). Caches already block-first (vLLM 0.32's) are kept.
    """
    if t.dim() == 5 and t.shape[0] == 2 and num_blocks and t.shape[1] != 2 and t.shape[1] % num_blocks == 0:
        return t.permute(1, 3, 0, 2, 4)
    return t


class PagedKV:
    def __init__(
        self,
        caches: dict[str, torch.Tensor],
        num_blocks: int,
        block_size: int,
        total_heads: int | None = None,
    ) -> None:
        names: list[str] = []
        layers: list[torch.Tensor] = []
        seen: set[tuple[int, tuple[int, ...]]] = set()
        for name, t in caches.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"layer {name}: KV cache is {type(t).__name__}, not a tensor")
            key = (t.data_ptr(), tuple(t.shape))
            if key in seen:  # layers sharing one cache (KV sharing) move once
                continue
            seen.add(key)
            names.append(name)
            layers.append(blocks_first(t, num_blocks))
        if not layers:
            raise ValueError("no KV cache layers")
        self.names, self.layers = names, layers
        rows = layers[0].shape[0]
        self.ratio = rows // num_blocks if num_blocks and rows % num_blocks == 0 else 1
        self.kernel_block_size = max(1, block_size // self.ratio)
        self.device = layers[0].device
        self.dtype = layers[0].dtype
        for n, t in zip(names, layers, strict=False):
            if t.dtype != self.dtype or t.device != self.device:
                raise ValueError(f"layer {n}: mixed dtypes/devices are not supported")
        self.block_bytes = [math.prod(t.shape[1:]) * t.element_size() for t in layers]
        # KV heads of this rank (dim 1) and of the model, when every layer agrees; else
        # None, and only whole blocks move (equal TP).
        heads = {t.shape[1] if t.dim() >= 4 else None for t in layers}
        self.heads: int | None = heads.pop() if len(heads) == 1 else None
        self.total_heads = total_heads if total_heads is not None else self.heads
        # CPU caches with dense blocks are sent and received in place (no copies).
        self.host_direct = self.device.type == "cpu" and all(_block_contiguous(t) for t in layers)
        self._u8: list[np.ndarray] = []
        self._flat: list[np.ndarray | None] = []
        if self.host_direct:
            for t, bb in zip(layers, self.block_bytes, strict=False):
                base = t.detach().view(torch.uint8).numpy() if t.dim() > 1 else t.numpy().view(np.uint8)
                stride0 = t.stride(0) * t.element_size()
                self._u8.append(np.lib.stride_tricks.as_strided(base, (t.shape[0], bb), (stride0, 1)))
                dense = stride0 == bb
                self._flat.append(np.lib.stride_tricks.as_strided(base, (t.shape[0] * bb,), (1,)) if dense else None)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def kblocks(self, block_ids: Sequence[int]) -> list[int]:
        """Scheduler block ids -> kernel block rows, in token order."""
        r = self.ratio
        if r == 1:
            return list(block_ids)
        return [b * r + i for b in block_ids for i in range(r)]

    def layer_bytes(self, layer: int, count: int) -> int:
        return self.block_bytes[layer] * count

    def is_whole(self, heads: Heads | None) -> bool:
        return heads is None or heads == (0, self.heads)

    def unit_bytes(self, layer: int, heads: Heads | None) -> int:
        """Bytes of one block of `layer` on the wire: the whole block, or heads [a, b) of it."""
        if self.is_whole(heads):
            return self.block_bytes[layer]
        assert heads is not None and self.heads
        return self.block_bytes[layer] // self.heads * (heads[1] - heads[0])

    def heads_error(self, heads: Any) -> str | None:
        """Why `heads` (from a peer) is not a range of this rank's heads, or None."""
        if heads is None:
            return None
        if self.heads is None:
            return "this cache has no head dimension to split"
        ok = isinstance(heads, list | tuple) and len(heads) == 2 and all(type(h) is int for h in heads)
        if not ok or not 0 <= heads[0] < heads[1] <= self.heads:
            return f"heads {heads} are not a range of this rank's {self.heads}"
        return None

    def signature(self) -> dict[str, Any]:
        """What both sides must agree on for the bytes to mean the same thing."""
        return {
            "dtype": str(self.dtype).removeprefix("torch."),
            "kernel_block_size": self.kernel_block_size,
            "block_shapes": [list(t.shape[1:]) for t in self.layers],
            "layers": len(self.layers),
            "names_crc": zlib.crc32("\n".join(self.names).encode()),
            "total_heads": self.total_heads,
        }

    def host_runs(
        self, layer: int, kblocks: Sequence[int], max_bytes: int, heads: Heads | None = None
    ) -> list[memoryview]:
        """Writable zero-copy views over `kblocks` of one layer, adjacent blocks merged;
        with `heads`, one view per block of those heads (a dense block is head-major)."""
        assert self.host_direct
        u8, flat, bb = self._u8[layer], self._flat[layer], self.block_bytes[layer]
        if not self.is_whole(heads):
            assert heads is not None and self.heads
            hb = bb // self.heads
            lo, hi = heads[0] * hb, heads[1] * hb
            return [memoryview(u8[k][lo:hi]) for k in kblocks]
        views: list[memoryview] = []
        i, n = 0, len(kblocks)
        while i < n:
            j = i + 1
            if flat is not None:
                while j < n and kblocks[j] == kblocks[j - 1] + 1 and (j - i + 1) * bb <= max_bytes:
                    j += 1
                views.append(memoryview(flat[kblocks[i] * bb : kblocks[j - 1] * bb + bb]))  # type: ignore[arg-type]  # an ndarray is a buffer
            else:
                views.append(memoryview(u8[kblocks[i]]))
            i = j
        return views


def signature_mismatch(mine: dict[str, Any], theirs: dict[str, Any], by_heads: bool = False) -> str | None:
    """Why the peer's bytes would not mean the same as ours, or None. `by_heads`: the pull
    moves a head range, so the ranks' head counts may differ but the model's may not."""
    keys = ("dtype", "kernel_block_size", "layers", "names_crc") + (("total_heads",) if by_heads else ("block_shapes",))
    for key in keys:
        if mine.get(key) != theirs.get(key):
            return f"KV layout mismatch on {key}: {mine.get(key)} here, {theirs.get(key)} on the peer"
    if by_heads:
        a, b = mine.get("block_shapes") or [], theirs.get("block_shapes") or []
        if len(a) != len(b) or any(list(x[1:]) != list(y[1:]) for x, y in zip(a, b, strict=False)):
            return f"KV layout mismatch on block shapes past the head dim: {a} here, {b} on the peer"
    return None
