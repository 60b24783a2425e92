"""CUDA staging path of the transfer (pinned ring, copy streams); skipped without a GPU.

Runs on the device machine: `python3 tests/test_connector_cuda.py` (no pytest needed)
or under pytest.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connector.config import PdbenchConfig
from connector.layout import PagedKV
from connector.staging import Stager
from connector.transport import Completions, IOLoop, KVClient, KVServer, PullJob

try:
    import pytest

    pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
except ImportError:  # the device image may lack pytest
    pytest = None  # type: ignore[assignment]


def _caches(device: str, n_blocks: int, seed: int | None, strided: bool = True) -> dict[str, torch.Tensor]:
    out = {}
    for i in range(4):
        if strided:  # flash-attention style: K and V halves outside the block dim
            raw = torch.zeros(2, n_blocks, 16, 2, 64, dtype=torch.bfloat16, device=device)
            view = raw.transpose(0, 1)
        else:
            view = torch.zeros(n_blocks, 2, 16, 2 * 64, dtype=torch.bfloat16, device=device)
        if seed is not None:
            g = torch.Generator(device=device).manual_seed(seed + i)
            view.copy_(torch.randn(view.shape, generator=g, device=device).to(torch.bfloat16))
        out[f"l{i}"] = view
    return out


def _transfer(
    src: dict[str, torch.Tensor],
    dst: dict[str, torch.Tensor],
    port: int,
    chunk: int,
    src_blocks: list[int],
    dst_blocks: list[int],
    **cfg: Any,
) -> bool:
    n_src, n_dst = next(iter(src.values())).shape[0], next(iter(dst.values())).shape[0]
    kp, kd = PagedKV(src, n_src, 16), PagedKV(dst, n_dst, 16)
    c = PdbenchConfig(port=port, chunk_bytes=chunk, **cfg)
    sp = None if kp.host_direct else Stager(kp, chunk, 3)
    sd = None if kd.host_direct else Stager(kd, chunk, 3)
    iop, iod = IOLoop("p"), IOLoop("d")
    try:
        srv = KVServer(kp, sp, c, "P", port, Completions())
        iop.submit(srv.start()).result(10)
        ready = torch.cuda.Event()
        ready.record()
        iop.call(srv.register, "r", src_blocks, ready)
        cli = KVClient(kd, sd, c, Completions())
        job = PullJob("d", "r", "P", "127.0.0.1", port, 0, dst_blocks, dst_blocks)
        return bool(iod.submit(cli.pull(job)).result(60))
    finally:
        iop.stop()
        iod.stop()


def test_gpu_to_gpu_many_chunks_bit_exact() -> None:
    src, dst = _caches("cuda", 64, seed=3), _caches("cuda", 80, seed=None)
    s_blocks, d_blocks = list(range(3, 53)), list(range(79, 29, -1))
    assert _transfer(src, dst, 15735, 1 << 14, s_blocks, d_blocks)  # 16 KiB chunks: ~100 chunks, ring of 3
    torch.cuda.synchronize()
    for n in src:
        assert torch.equal(dst[n][d_blocks], src[n][s_blocks])
        assert not dst[n][list(range(0, 29))].any()


def test_cpu_prefill_to_gpu_decode_and_corruption() -> None:
    src = {k: v.cpu() for k, v in _caches("cuda", 16, seed=5, strided=False).items()}
    dst = _caches("cuda", 16, seed=None, strided=False)
    assert _transfer(src, dst, 15736, 1 << 20, [1, 2, 3], [7, 8, 9], debug_corrupt=True)
    torch.cuda.synchronize()
    for n in src:
        assert torch.equal(dst[n][[7, 8]].cpu(), src[n][[1, 2]])
        assert not dst[n][9].any()  # the last block was zeroed on purpose


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("no CUDA: skipped")
        sys.exit(0)
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            t0 = time.perf_counter()
            fn()
            print(f"PASS {name} ({time.perf_counter() - t0:.2f}s)")
