"""Block gather for CUDA IPC pulls: one Triton launch for every layer, one pass over the bytes.

torch's index_select + index_copy_ read and write each byte twice and cost two launches
per layer (~25 us of host time each, so a 1-block pull of 28 layers took ~1.3 ms). The
kernel copies each block's dense runs straight from prefill's blocks into ours. Layers of
differing layouts, or no Triton, use the torch path (`Plan.pairs`).
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

USE_TRITON = True  # tests turn it off to check the torch path
_MAX_RUNS = 4096  # dense runs per block; beyond that the layout is too fragmented to bother

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _gather(
        src_base,
        dst_base,
        src_layer,
        dst_layer,
        sidx,
        didx,
        s_run,
        d_run,
        s_bstride,
        d_bstride,
        runs,
        run_elems,
        BLOCK: tl.constexpr,
        VEC: tl.constexpr,
    ):
        # Addresses are int64 elements from the lowest layer's (a tensor argument, so Triton
        # knows its alignment); VEC tells it 16-byte runs, for vector loads and stores.
        pid, layer, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        i, r = pid // runs, pid % runs
        s_off = tl.load(src_layer + layer) + tl.load(sidx + i) * s_bstride + tl.load(s_run + r)
        d_off = tl.load(dst_layer + layer) + tl.load(didx + i) * d_bstride + tl.load(d_run + r)
        s_off = tl.multiple_of(s_off, VEC)
        d_off = tl.multiple_of(d_off, VEC)
        offs = part * BLOCK + tl.arange(0, BLOCK)
        mask = offs < run_elems
        tl.store(dst_base + d_off + offs, tl.load(src_base + s_off + offs, mask=mask), mask=mask)

except ImportError:  # CPU-only installs: the torch path
    triton = None  # type: ignore[assignment, unused-ignore]


@dataclass
class _Side:
    """One side's layers: the lowest one, each layer's start from it, each block run's start (elements)."""

    base: torch.Tensor
    layer: torch.Tensor
    run: torch.Tensor
    bstride: int
    aligned: bool  # every run starts on 16 bytes


@dataclass
class _Kernel:
    src: _Side
    dst: _Side
    runs: int
    run_elems: int


@dataclass
class Plan:
    pairs: list[tuple[torch.Tensor, torch.Tensor]]  # (source layer, our layer), same-width integer views
    kernel: _Kernel | None


def make_plan(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Plan:
    return Plan(pairs, _kernel(pairs) if triton is not None and USE_TRITON else None)


def _kernel(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> _Kernel | None:
    s0, d0 = pairs[0]

    def key(s: torch.Tensor, d: torch.Tensor) -> tuple[Any, ...]:
        return s.dtype, tuple(s.shape[1:]), s.stride(), d.stride()

    inner = list(s0.shape[1:])
    runs = math.prod(inner[:-1])
    if any(key(s, d) != key(s0, d0) for s, d in pairs) or s0.stride(-1) != 1 or d0.stride(-1) != 1:
        return None
    if runs > _MAX_RUNS or s0.dtype != torch.int64:  # 8-byte aligned runs (any usual KV layout)
        return None
    starts = list(itertools.product(*(range(k) for k in inner[:-1])))
    src = _side([s for s, _ in pairs], starts)
    dst = _side([d for _, d in pairs], starts)
    return _Kernel(src, dst, runs, inner[-1])


def _side(layers: list[torch.Tensor], starts: list[tuple[int, ...]]) -> _Side:
    base = min(layers, key=lambda t: t.data_ptr())
    dev = base.device
    layer = [(t.data_ptr() - base.data_ptr()) // 8 for t in layers]
    strides = base.stride()[1:-1]
    run = [sum(i * s for i, s in zip(st, strides, strict=True)) for st in starts]
    aligned = base.data_ptr() % 16 == 0 and all(x % 2 == 0 for x in (*layer, *run, base.stride(0)))
    return _Side(
        base,
        torch.tensor(layer, dtype=torch.int64, device=dev),
        torch.tensor(run, dtype=torch.int64, device=dev),
        base.stride(0),
        aligned,
    )


def launch(plan: Plan, lo: int, hi: int, sidx: torch.Tensor, didx: torch.Tensor, chunk_bytes: int) -> None:
    """Copy blocks sidx -> didx of layers [lo, hi) on the current stream."""
    k = plan.kernel
    if not len(sidx):
        return
    if k is None:
        for src, dst in plan.pairs[lo:hi]:
            _torch_gather(src, dst, sidx, didx, chunk_bytes)
        return
    block = min(1024, triton.next_power_of_2(k.run_elems))
    vec = 2 if k.src.aligned and k.dst.aligned and k.run_elems % 2 == 0 else 1
    grid = (len(sidx) * k.runs, hi - lo, triton.cdiv(k.run_elems, block))
    _gather[grid](
        k.src.base,
        k.dst.base,
        k.src.layer[lo:hi],
        k.dst.layer[lo:hi],
        sidx,
        didx,
        k.src.run,
        k.dst.run,
        k.src.bstride,
        k.dst.bstride,
        k.runs,
        k.run_elems,
        BLOCK=block,
        VEC=vec,
    )


def _torch_gather(src: torch.Tensor, dst: torch.Tensor, sidx: torch.Tensor, didx: torch.Tensor, chunk: int) -> None:
    n = len(sidx)
    per = max(1, chunk // (math.prod(dst.shape[1:]) * dst.element_size()))  # bounds the temporary
    for a in range(0, n, per):
        dst.index_copy_(0, didx[a : a + per], src.index_select(0, sidx[a : a + per]))
