"""Every wait of the staging ring is bounded (connector/staging.py): a stuck device copy, a
ring that never frees, and a pull that meets either fail with StagingTimeout naming what
stalled, instead of hanging. Runs on CPU: the ring also stages strided CPU layouts, and a
blocking event stands in for a CUDA event that never completes."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import torch

from benchmarks.common import free_port
from connector.config import PdbenchConfig
from connector.layout import PagedKV
from connector.staging import SLOWEST_COPY_BPS, Stager, StagingTimeout
from connector.transport import Completions, IOLoop, KVClient, KVServer, PullJob


class StuckEvent:
    """A copy's event that completes only when the test releases it."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def synchronize(self) -> None:
        self.release.wait(30)


def _strided_kv(n_blocks: int, fill: bool) -> PagedKV:
    """K and V halves outside the block dim, as vLLM's flash-attention cache: not host-direct."""
    g = torch.Generator().manual_seed(2)
    caches = {}
    for i in range(2):
        raw = torch.randn(2, n_blocks, 16, 2, 32, generator=g) if fill else torch.zeros(2, n_blocks, 16, 2, 32)
        caches[f"l{i}"] = raw.transpose(0, 1)
    kv = PagedKV(caches, n_blocks, 16)
    assert not kv.host_direct  # the precondition: this layout goes through the ring
    return kv


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_stuck_copy_fails_after_its_bound_which_grows_with_its_size() -> None:
    st = Stager(_strided_kv(4, False), 1 << 16, 2, wait_s=0.2)
    ev = StuckEvent()
    try:
        t0 = time.monotonic()
        with pytest.raises(StagingTimeout, match=r"H2D copy of chunk 3 did not complete within 0\.2 s"):
            _run(st._wait(ev, "H2D copy of chunk 3"))
        assert 0.15 < time.monotonic() - t0 < 5
        nbytes = int(0.3 * SLOWEST_COPY_BPS)  # 0.3 s more at the slowest rate counted as progress
        t0 = time.monotonic()
        with pytest.raises(StagingTimeout, match=r"device copy of 9 blocks did not complete within 0\.5 s"):
            _run(st._wait(ev, "device copy of 9 blocks", nbytes))
        assert 0.45 < time.monotonic() - t0 < 5
    finally:
        ev.release.set()
        st.close()


def test_a_copy_that_completes_in_time_passes() -> None:
    st = Stager(_strided_kv(4, False), 1 << 16, 2, wait_s=5)
    ev = StuckEvent()
    threading.Timer(0.1, ev.release.set).start()
    try:
        _run(st._wait(ev, "D2H copy"))
        assert ev.release.is_set()
    finally:
        st.close()


def test_waiting_for_a_ring_is_bounded() -> None:
    st = Stager(_strided_kv(4, False), 1 << 16, 2, max_rings=1, wait_s=0.2)

    async def second_ring() -> None:
        await st._ring()  # the only ring, held by a transfer that never ends
        await st._ring()

    try:
        t0 = time.monotonic()
        with pytest.raises(StagingTimeout, match=r"no staging ring free within 0\.2 s \(1 transfers staging\)"):
            _run(second_ring())
        assert 0.15 < time.monotonic() - t0 < 5
    finally:
        st.close()


def test_a_ring_whose_copies_stall_is_dropped_not_reused() -> None:
    st = Stager(_strided_kv(4, False), 1 << 16, 2, max_rings=1, wait_s=0.2)
    stuck = StuckEvent()
    st._event = lambda stream: stuck  # type: ignore[method-assign]

    async def scenario() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ring = await st._ring()
        st.cuda = True  # as on a GPU: the drain of the copy stream is what stalls
        with pytest.raises(StagingTimeout, match="D2H copies leaving the ring did not complete"):
            await st._give_back(ring, None, "D2H")
        st.cuda = False
        return ring, await st._ring()  # a fresh ring, at once: the stuck one is gone

    try:
        old, new = _run(scenario())
        assert all(a.data_ptr() != b.data_ptr() for a in old for b in new)
    finally:
        stuck.release.set()
        st.close()


def test_a_pull_that_finds_no_free_ring_fails_fast_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    """Prefill's only ring is held: the pull fails within about wait_s, decode learns at once
    (the connection closes), and prefill's log names the stall; the blocks stay held."""
    caplog.set_level(logging.WARNING, logger="connector.transport")
    port = free_port()
    kp, kd = _strided_kv(12, True), _strided_kv(12, False)
    cfg = PdbenchConfig(port=port, chunk_bytes=1 << 14, io_timeout_s=5.0)
    sp = Stager(kp, 1 << 14, 2, max_rings=1, wait_s=0.3)
    sd = Stager(kd, 1 << 14, 2, wait_s=5.0)
    iop, iod = IOLoop("p"), IOLoop("d")
    try:
        held = iop.submit(sp._ring()).result(5)  # a transfer that never gives its ring back
        assert held
        srv = KVServer(kp, sp, cfg, "P", port, Completions())
        iop.submit(srv.start()).result(10)
        iop.call(srv.register, "r", list(range(8)))
        done = Completions()
        cli = KVClient(kd, sd, cfg, done)
        t0 = time.monotonic()
        ok = iod.submit(cli.pull(PullJob("d", "r", "P", "127.0.0.1", port, 0, [11, 10, 9], [11, 10, 9]))).result(20)
        took = time.monotonic() - t0
        assert not ok
        assert 0.25 < took < 4.5  # prefill's ring bound, well before decode's own 5 s
        stats = done.drain_stats()
        assert stats is not None and stats.failed_recv == 1
        deadline = time.monotonic() + 5
        while "no staging ring free" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "StagingTimeout: no staging ring free within 0.3 s" in caplog.text
        assert "blocks kept for another lease" in caplog.text
    finally:
        iop.stop()
        iod.stop()
        sp.close()
        sd.close()
