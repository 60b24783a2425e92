"""CUDA paths of the transfer: the staged TCP path (pinned ring, copy streams), up to the
KV of a 65,536-token prompt, and the same-host CUDA IPC path (two processes, GPU to GPU).

Runs on the device machine: `PDBENCH_REQUIRE_CUDA=1 python3 tests/connector/test_connector_cuda.py`
(no pytest needed; exit 0 only if every test passed) or under pytest. Without CUDA the
tests are skipped, unless PDBENCH_REQUIRE_CUDA is set (not "" or "0"): then the script
exits 1 and every test fails, so a machine that should have a GPU cannot pass by skipping.
The peer case (prefill on GPU 1, decode on GPU 0) needs two GPUs with peer access: it is
skipped on one GPU unless PDBENCH_REQUIRE_CUDA is 2 or more (the GPUs the machine must have).
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from connector import gather, ipc
from connector.config import PdbenchConfig
from connector.layout import PagedKV
from connector.staging import Stager
from connector.transport import Completions, IOLoop, KVClient, KVServer, PullJob, TransferStats

_REQUIRE = os.environ.get("PDBENCH_REQUIRE_CUDA", "")
REQUIRE_CUDA = _REQUIRE not in ("", "0")
REQUIRED_GPUS = int(_REQUIRE) if _REQUIRE.isdigit() else int(REQUIRE_CUDA)  # any other value: one
HAVE_CUDA = torch.cuda.is_available()
NO_CUDA = (
    f"PDBENCH_REQUIRE_CUDA is set but torch {torch.__version__} sees no CUDA device "
    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r})"
)

try:
    import pytest

    pytestmark = pytest.mark.skipif(
        not HAVE_CUDA and not REQUIRE_CUDA, reason="needs CUDA (PDBENCH_REQUIRE_CUDA=1 makes that a failure)"
    )

    @pytest.fixture(autouse=True)
    def _cuda_required() -> None:
        if not HAVE_CUDA:  # only reached when required: fail with the reason, not a CUDA error
            pytest.fail(NO_CUDA, pytrace=False)

    _Skip: type[BaseException] = pytest.skip.Exception
except ImportError:  # the device image may lack pytest
    pytest = None  # type: ignore[assignment]

    class _Skip(Exception):  # type: ignore[no-redef]
        """A test this machine cannot run; main() reports it as skipped."""


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
    heads: tuple[tuple[int, int], tuple[int, int]] | None = None,
    **cfg: Any,
) -> tuple[bool, TransferStats | None]:
    """One pull from `src` to `dst` (the decode side's success and stats); `heads`: (prefill's,
    ours) head ranges (differing TP)."""
    n_src, n_dst = next(iter(src.values())).shape[0], next(iter(dst.values())).shape[0]
    total = next(iter(src.values())).shape[1]
    kp, kd = PagedKV(src, n_src, 16, total), PagedKV(dst, n_dst, 16, total)
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
        done = Completions()
        cli = KVClient(kd, sd, c, done)
        rh, lh = heads or (None, None)
        job = PullJob("d", "r", "P", "127.0.0.1", port, 0, dst_blocks, dst_blocks, rh, lh)
        # Bounded by its size (the transport's own waits fail a stall within io_timeout_s).
        ok = iod.submit(cli.pull(job)).result(60 + len(dst_blocks) * sum(kd.block_bytes) / 50e6)
        return bool(ok), done.drain_stats()
    finally:
        iop.stop()
        iod.stop()


def test_gpu_to_gpu_many_chunks_bit_exact() -> None:
    src, dst = _caches("cuda", 64, seed=3), _caches("cuda", 80, seed=None)
    s_blocks, d_blocks = list(range(3, 53)), list(range(79, 29, -1))
    assert _transfer(src, dst, 15735, 1 << 14, s_blocks, d_blocks)[0]  # 16 KiB chunks: ~100 chunks, ring of 3
    torch.cuda.synchronize()
    for n in src:
        assert torch.equal(dst[n][d_blocks], src[n][s_blocks])
        assert not dst[n][list(range(0, 29))].any()


def test_cpu_prefill_to_gpu_decode_and_corruption() -> None:
    src = {k: v.cpu() for k, v in _caches("cuda", 16, seed=5, strided=False).items()}
    dst = _caches("cuda", 16, seed=None, strided=False)
    assert _transfer(src, dst, 15736, 1 << 20, [1, 2, 3], [7, 8, 9], debug_corrupt=True)[0]
    torch.cuda.synchronize()
    for n in src:
        assert torch.equal(dst[n][[7, 8]].cpu(), src[n][[1, 2]])
        assert not dst[n][9].any()  # the last block was zeroed on purpose


def test_gpu_head_range_into_a_smaller_tp_rank_bit_exact() -> None:
    """Prefill TP 1 (2 heads) to a decode rank of TP 2 (1 head): the staging ring carries
    head 1 of every block, in many chunks, into decode's only head."""
    src = _caches("cuda", 40, seed=7, strided=False)
    dst = {k: torch.zeros(48, 1, *v.shape[2:], dtype=v.dtype, device="cuda") for k, v in src.items()}
    s_blocks, d_blocks = list(range(2, 34)), list(range(47, 15, -1))
    assert _transfer(src, dst, 15739, 1 << 13, s_blocks, d_blocks, heads=((1, 2), (0, 1)))[0]
    torch.cuda.synchronize()
    for n in src:
        assert torch.equal(dst[n][d_blocks].view(torch.int16), src[n][s_blocks, 1:2].view(torch.int16))
        assert not dst[n][list(range(0, 16))].any()


LONG_TOKENS = 65536  # one long-context prompt


def _long_caches(n_blocks: int, seed: int | None) -> dict[str, torch.Tensor]:
    """benchmarks/bench_connector_cuda.py's layout: 28 layers, 16-token blocks, 4 KV heads x 128,
    bf16, K and V halves outside the block dim (57,344 bytes a token)."""
    out = {}
    for i in range(28):
        raw = torch.zeros(2, n_blocks, 16, 4, 128, dtype=torch.bfloat16, device="cuda")
        if seed is not None:
            raw.normal_(generator=torch.Generator(device="cuda").manual_seed(seed + i))
        out[f"layers.{i}"] = raw.transpose(0, 1)
    return out


def test_long_prompt_over_tcp_staging_bit_exact() -> None:
    """The KV of a 65,536-token prompt (3.76 GB) over TCP through the pinned ring: 16 MiB
    chunks, 224 of them through 3 slots, both sides on this GPU. It must finish within its
    size's bound, by the TCP path, every byte counted and landed bit for bit."""
    n = LONG_TOKENS // 16
    src, dst = _long_caches(n, seed=21), _long_caches(n + 8, seed=None)
    s_blocks, d_blocks = list(range(n)), list(range(n + 7, 7, -1))  # reversed: no merged runs
    t0 = time.perf_counter()
    ok, stats = _transfer(src, dst, 15740, 16 << 20, s_blocks, d_blocks, ipc=False)
    took = time.perf_counter() - t0
    assert ok and stats is not None, "the pull failed"
    assert (stats.recv_tcp, stats.recv_ipc) == (1, 0)
    assert stats.recv_bytes == [LONG_TOKENS * 28 * 2 * 4 * 128 * 2] == [3_758_096_384]
    torch.cuda.synchronize()
    for name in src:
        assert torch.equal(dst[name][d_blocks].view(torch.int16), src[name][s_blocks].view(torch.int16)), name
        assert not dst[name][:8].any()
    print(f"  {LONG_TOKENS} tokens, {stats.recv_bytes[0] / 1e9:.2f} GB in {took:.1f} s (one process, both sides)")


# -- CUDA IPC: prefill and decode in two processes on one GPU ------------------------------

N_SRC, N_DST, SEED = 64, 80, 11
SRC_BLOCKS = list(range(5, 55))  # the request's blocks at prefill


def _prefill_main(
    port: int, cfg: dict[str, Any], reqs: list[str], strided: bool, device: str, up: Any, stop: Any, out: Any
) -> None:
    """Child process: a prefill worker on `device` holding `reqs` (all on SRC_BLOCKS) until `stop`."""
    torch.cuda.set_device(device)  # its events and streams belong to its KV's GPU
    kv = PagedKV(_caches(device, N_SRC, SEED, strided), N_SRC, 16)
    c = PdbenchConfig(port=port, chunk_bytes=1 << 14, **cfg)
    done = Completions()
    io = IOLoop("p")
    srv = KVServer(kv, Stager(kv, c.chunk_bytes, 3), c, "P", port, done)
    io.submit(srv.start()).result(10)
    ready = torch.cuda.Event()
    ready.record()  # after the caches were written, as the worker does
    for r in reqs:
        io.call(srv.register, r, SRC_BLOCKS, ready)
    up.set()
    stop.wait(120)
    time.sleep(0.2)  # the last ack lands
    out.put((srv.ipc is not None, sorted(done.drain()[0]), (done.drain_stats() or TransferStats()).as_dict()))
    io.stop()


@contextmanager
def _prefill(
    port: int, reqs: list[str], strided: bool = True, device: str = "cuda:0", **cfg: Any
) -> Iterator[dict[str, Any]]:
    """A prefill child; yields a dict that holds its (offered IPC, sent ids, stats) on exit."""
    ctx = mp.get_context("spawn")
    up, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_prefill_main, args=(port, cfg, reqs, strided, device, up, stop, out), daemon=True)
    proc.start()
    result: dict[str, Any] = {}
    try:
        assert up.wait(120), "prefill child did not start"
        yield result
        stop.set()
        result["offered"], result["sent"], result["stats"] = out.get(timeout=60)
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()


@dataclass
class _Pulled:
    ok: bool
    stats: Any
    dst: dict[str, torch.Tensor]
    kernel: bool  # the copy took connector/gather.py's Triton kernel


def _decode_pull(
    port: int,
    req: str,
    first: int,
    dst_blocks: list[int],
    up: Any = None,
    strided: bool = True,
    heads: tuple[int, int] | None = None,
    **cfg: Any,
) -> _Pulled:
    """Pull `req` into a fresh decode cache in this process; `up` is set just before the pull.
    `heads`: only those of prefill's heads, into a one-head cache (a rank of a larger TP)."""
    dst = _caches("cuda", N_DST, None, strided)
    if heads is not None:
        dst = {k: v[:, heads[0] : heads[1]].contiguous() for k, v in dst.items()}
    kd = PagedKV(dst, N_DST, 16, 2)
    c = PdbenchConfig(chunk_bytes=1 << 14, **cfg)
    done, io = Completions(), IOLoop("d")
    cli = KVClient(kd, Stager(kd, c.chunk_bytes, 3), c, done)
    try:
        if up is not None:
            up.set()
        lh = None if heads is None else (0, heads[1] - heads[0])
        job = PullJob("d", req, "P", "127.0.0.1", port, first, dst_blocks, dst_blocks, heads, lh)
        ok = io.submit(cli.pull(job)).result(60)
        kernel = any(r is not None and r.plan.kernel is not None for r in cli._remotes.values())
    finally:
        io.stop()
        cli.close()
    torch.cuda.synchronize()
    return _Pulled(bool(ok), done.drain_stats(), dst, kernel)


def _assert_bit_exact(
    dst: dict[str, torch.Tensor],
    src_blocks: list[int],
    dst_blocks: list[int],
    strided: bool = True,
    src_device: str = "cuda:0",
) -> None:
    expected = _caches(src_device, N_SRC, SEED, strided)  # what the child holds (same seed, same GPU)
    untouched = sorted(set(range(N_DST)) - set(dst_blocks))
    for n in expected:
        want = expected[n][src_blocks].to(dst[n].device)
        assert torch.equal(dst[n][dst_blocks].view(torch.int16), want.view(torch.int16)), n
        assert not dst[n][untouched].any()


def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def test_ipc_pull_two_processes_bit_exact() -> None:
    port = 15737
    d_blocks = list(range(N_DST - 1, N_DST - 46, -1))  # 45 blocks, reversed: no two adjacent runs
    with _prefill(port, ["r", "torch-path"]) as res:
        p = _decode_pull(port, "r", 5, d_blocks)
        gather.USE_TRITON = False  # the same pull through torch's index_select/index_copy_
        try:
            q = _decode_pull(port, "torch-path", 5, d_blocks)
        finally:
            gather.USE_TRITON = True
    for pulled in (p, q):
        assert pulled.ok and pulled.stats is not None
        assert (pulled.stats.recv_ipc, pulled.stats.recv_tcp) == (1, 0)
        assert pulled.stats.recv_bytes == [45 * sum(PagedKV(pulled.dst, N_DST, 16).block_bytes)]
        _assert_bit_exact(pulled.dst, SRC_BLOCKS[5:], d_blocks)
    assert p.kernel == _has_triton() and not q.kernel
    assert res["offered"] and res["sent"] == ["r", "torch-path"]
    assert (res["stats"]["send_ipc"], res["stats"]["send_tcp"]) == (2, 0)


def test_ipc_pull_from_a_peer_gpu_bit_exact() -> None:
    """Prefill on GPU 1, decode on GPU 0 (the two-GPU 1P1D's layout): decode opens prefill's
    blocks on its own GPU as a peer and copies them over NVLink/PCIe, never through TCP."""
    gpus = torch.cuda.device_count()
    if gpus < 2 or not torch.cuda.can_device_access_peer(0, 1):
        why = f"needs 2 GPUs with peer access; {gpus} visible"
        if REQUIRED_GPUS >= 2:
            raise AssertionError(f"PDBENCH_REQUIRE_CUDA={_REQUIRE} but {why}")
        raise _Skip(why + " (PDBENCH_REQUIRE_CUDA=2 makes that a failure)")
    port = 15736
    d_blocks = list(range(N_DST - 1, N_DST - 46, -1))
    with _prefill(port, ["r"], device="cuda:1") as res:
        p = _decode_pull(port, "r", 5, d_blocks)
    assert p.ok and p.stats is not None
    assert (p.stats.recv_ipc, p.stats.recv_tcp) == (1, 0)
    assert all(t.device == torch.device("cuda:0") for t in p.dst.values())
    _assert_bit_exact(p.dst, SRC_BLOCKS[5:], d_blocks, src_device="cuda:1")
    assert res["offered"] and res["sent"] == ["r"]
    assert (res["stats"]["send_ipc"], res["stats"]["send_tcp"]) == (1, 0)


def test_ipc_off_or_another_host_falls_back_to_tcp_bit_exact() -> None:
    port = 15738
    d_blocks = list(range(10, 60))
    real = ipc.boot_id
    # Dense blocks this time: the copy kernel moves each block as one run.
    with _prefill(port, ["off", "other-host", "corrupt", "heads"], strided=False) as res:
        p = _decode_pull(port, "off", 0, d_blocks, strided=False, ipc=False)
        assert p.ok and p.stats is not None and (p.stats.recv_ipc, p.stats.recv_tcp) == (0, 1)
        _assert_bit_exact(p.dst, SRC_BLOCKS, d_blocks, strided=False)
        ipc.boot_id = lambda: "0" * 36  # type: ignore[assignment]  # decode claims another host
        try:
            p = _decode_pull(port, "other-host", 0, d_blocks, strided=False)
        finally:
            ipc.boot_id = real  # type: ignore[assignment]
        assert p.ok and p.stats is not None and (p.stats.recv_ipc, p.stats.recv_tcp) == (0, 1)
        _assert_bit_exact(p.dst, SRC_BLOCKS, d_blocks, strided=False)
        # The IPC path's own corruption hook proves the comparison above can fail.
        p = _decode_pull(port, "corrupt", 0, d_blocks, strided=False, debug_corrupt=True)
        assert p.ok and p.stats is not None and p.stats.recv_ipc == 1 and p.kernel == _has_triton()
        _assert_bit_exact(p.dst, SRC_BLOCKS[:-1], d_blocks[:-1], strided=False)
        assert all(not t[d_blocks[-1]].any() for t in p.dst.values())
        # A head range (differing TP) is not what IPC moves: the same host pulls it over TCP.
        p = _decode_pull(port, "heads", 0, d_blocks, strided=False, heads=(1, 2))
        assert p.ok and p.stats is not None and (p.stats.recv_ipc, p.stats.recv_tcp) == (0, 1)
        expected = _caches("cuda", N_SRC, SEED, strided=False)
        for n in expected:
            assert torch.equal(p.dst[n][d_blocks].view(torch.int16), expected[n][SRC_BLOCKS, 1:2].view(torch.int16))
    assert res["stats"]["send_tcp"] == 3 and res["stats"]["send_ipc"] == 1


def _decode_main(port: int, up: Any) -> None:
    """Child process: an IPC pull slowed to ~1 s per layer, killed by the test meanwhile."""
    _decode_pull(port, "r", 0, list(range(10, 60)), up, debug_chunk_delay_s=1.0)


def test_decode_dying_mid_ipc_pull_keeps_blocks_until_the_lease() -> None:
    port = 15739
    src = _caches("cuda", N_SRC, SEED)
    before = {n: t.clone() for n, t in src.items()}
    kp = PagedKV(src, N_SRC, 16)
    # io_timeout_s well above the time to notice the death: the failure must come from the kill.
    c = PdbenchConfig(port=port, lease_s=1.5, io_timeout_s=10.0, chunk_bytes=1 << 14)
    done, io = Completions(), IOLoop("p")
    srv = KVServer(kp, Stager(kp, c.chunk_bytes, 3), c, "P", port, done)
    ctx = mp.get_context("spawn")
    up = ctx.Event()
    proc = ctx.Process(target=_decode_main, args=(port, up), daemon=True)
    try:
        io.submit(srv.start()).result(10)
        assert srv.ipc is not None
        proc.start()
        assert up.wait(60), "decode child did not start"
        # Registered now, so the short lease starts when decode pulls (a pull waits for it).
        io.call(srv.register, "r", SRC_BLOCKS, None)
        assert _wait_for(lambda: _sending(io, srv, "r"), 60), "decode never started pulling"
        time.sleep(1.5)  # mid copy: 4 layers at 1 s each (after compiling the copy kernel)
        proc.kill()  # the decode worker dies mid pull (SIGKILL: no ack, no close frame)
        t0 = time.monotonic()
        proc.join(10)
        assert _wait_for(lambda: bool(done.stats.failed_send), 2)  # the reset, not a timeout
        assert not done.drain()[0]  # not freed on the failure...
        assert _wait_for(lambda: "r" in done.drain()[0], 6)  # ...but at the lease
        assert 0.5 < time.monotonic() - t0 < 6.0
        st = done.drain_stats()
        assert st is not None and st.failed_send == 1 and st.expired == 1 and st.send_ipc == 0
        for n in src:  # prefill's KV was only ever read
            assert torch.equal(src[n], before[n])
    finally:
        io.stop()
        if proc.is_alive():
            proc.kill()


def _sending(io: IOLoop, srv: KVServer, req: str) -> bool:
    async def probe() -> bool:
        e = srv._entries.get(req)
        return e is not None and e.sending

    return bool(io.submit(probe()).result(5))


def _wait_for(cond: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def main() -> int:
    """Every test in this file, without pytest; 0 only if each passed (or, with no CUDA and
    none required, all were skipped)."""
    if not HAVE_CUDA:
        if REQUIRE_CUDA:
            print(f"FAIL: {NO_CUDA}")
            return 1
        print("no CUDA: skipped (PDBENCH_REQUIRE_CUDA=1 makes that a failure)")
        return 0
    failed = ran = skipped = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            ran += 1
            t0 = time.perf_counter()
            try:
                fn()
            except _Skip as why:
                skipped += 1
                print(f"SKIP {name}: {why}", flush=True)
            except Exception:
                failed += 1
                traceback.print_exc()
                print(f"FAIL {name} ({time.perf_counter() - t0:.2f}s)", flush=True)
            else:
                print(f"PASS {name} ({time.perf_counter() - t0:.2f}s)", flush=True)
    print(f"{ran - failed - skipped} of {ran} passed, {skipped} skipped on {torch.cuda.get_device_name()}")
    return 1 if failed or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
