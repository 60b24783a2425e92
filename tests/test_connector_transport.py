"""The connector's transfer layer without vLLM: paged layouts, TCP pulls, leases, dead peers."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from connector.config import PdbenchConfig
from connector.layout import PagedKV
from connector.protocol import recv_frame, send_frame
from connector.staging import Stager
from connector.transport import Completions, IOLoop, KVClient, KVServer, PullJob

PORTS = iter(range(15660, 15700))


def caches(n_blocks: int, fill: bool, layers: int = 3, heads: int = 2, bs: int = 16, c: int = 64,
           dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    out = {}
    for i in range(layers):
        t = torch.randn(n_blocks, heads, bs, c, generator=g).to(dtype) if fill else \
            torch.zeros(n_blocks, heads, bs, c, dtype=dtype)
        out[f"model.layers.{i}.self_attn.attn"] = t
    return out


def strided(c: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Same logical [B, H, N, C] views, heads outside blocks in memory (not block-dense)."""
    return {k: v.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3) for k, v in c.items()}


class Pair:
    """A server (prefill worker) and a client (decode worker), each on its own IO thread."""

    def __init__(self, src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], staged: bool = False,
                 **cfg: Any) -> None:
        self.port = next(PORTS)
        self.cfg = PdbenchConfig(port=self.port, **cfg)
        self.kp = PagedKV(src, next(iter(src.values())).shape[0], 16)
        self.kd = PagedKV(dst, next(iter(dst.values())).shape[0], 16)
        sp = Stager(self.kp, 1 << 16, 3) if staged or not self.kp.host_direct else None
        sd = Stager(self.kd, 1 << 16, 3) if staged or not self.kd.host_direct else None
        self.done_p, self.done_d = Completions(), Completions()
        self.iop, self.iod = IOLoop("test-p"), IOLoop("test-d")
        self.server = KVServer(self.kp, sp, self.cfg, "P", self.port, self.done_p)
        self.iop.submit(self.server.start()).result(5)
        self.client = KVClient(self.kd, sd, self.cfg, self.done_d)

    def register(self, req: str, kblocks: list[int]) -> None:
        self.iop.call(self.server.register, req, kblocks)

    def pull(self, req: str, first: int, kblocks: list[int], engine: str = "P", timeout: float = 30) -> bool:
        job = PullJob(f"d-{req}", req, engine, "127.0.0.1", self.port, first, kblocks, kblocks)
        return bool(self.iod.submit(self.client.pull(job)).result(timeout))

    def wait_sent(self, req: str, timeout: float = 10) -> float:
        t0 = time.monotonic()
        seen: set[str] = set()
        while time.monotonic() - t0 < timeout:
            seen |= self.done_p.drain()[0]
            if req in seen:
                return time.monotonic() - t0
            time.sleep(0.02)
        raise AssertionError(f"{req} never reported as sent")

    def close(self) -> None:
        self.iop.stop()
        self.iod.stop()


@pytest.fixture
def make_pair() -> Iterator[Any]:
    made: list[Pair] = []

    def make(*a: Any, **k: Any) -> Pair:
        p = Pair(*a, **k)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def test_layout_views_are_zero_copy_and_merge_adjacent_blocks() -> None:
    c = caches(10, True)
    kv = PagedKV(c, 10, 16)
    assert kv.host_direct and kv.ratio == 1 and kv.kernel_block_size == 16
    views = kv.host_runs(0, [2, 3, 4, 7], 1 << 30)
    assert [len(v) for v in views] == [3 * kv.block_bytes[0], kv.block_bytes[0]]
    views[1][:4] = b"\0\0\0\0"  # writes land in the cache itself
    assert c["model.layers.0.self_attn.attn"][7].flatten()[0].item() == 0.0
    assert not PagedKV(strided(c), 10, 16).host_direct


def test_kernel_blocks_expand_scheduler_blocks() -> None:
    kv = PagedKV(caches(20, False), 10, 32)  # 20 kernel rows for 10 scheduler blocks
    assert kv.ratio == 2 and kv.kernel_block_size == 16
    assert kv.kblocks([3, 7]) == [6, 7, 14, 15]


@pytest.mark.parametrize("kind", ["direct", "strided", "staged"])
def test_pull_moves_exactly_the_requested_blocks(make_pair: Any, kind: str) -> None:
    src, dst = caches(32, True), caches(40, False)
    if kind == "strided":
        src, dst = strided(src), strided(dst)
    p = make_pair(src, dst, staged=kind == "staged")
    p.register("r1", [5, 9, 10, 11, 20])      # prefill's blocks of the request
    assert p.pull("r1", 1, [30, 2, 3, 17])     # decode had block 0 cached; its ids differ
    for name in src:
        assert torch.equal(dst[name][[30, 2, 3, 17]], src[name][[9, 10, 11, 20]])
        untouched = [i for i in range(40) if i not in (30, 2, 3, 17)]
        assert not dst[name][untouched].any()
    p.wait_sent("r1")
    _, recvd, failed, _ = p.done_d.drain()
    assert recvd == {"d-r1"} and not failed
    st = p.done_d.drain_stats()
    assert st is not None and st.recv_bytes == [4 * 3 * p.kd.block_bytes[0]]


def test_bf16_and_mixed_host_paths_interoperate(make_pair: Any) -> None:
    src, dst = caches(8, True, dtype=torch.bfloat16), strided(caches(8, False, dtype=torch.bfloat16))
    p = make_pair(src, dst)
    p.register("r", [1, 2, 3])
    assert p.pull("r", 0, [4, 5, 6])
    for name in src:
        assert torch.equal(dst[name][[4, 5, 6]], src[name][[1, 2, 3]])


def test_corruption_flag_changes_the_bytes(make_pair: Any) -> None:
    src, dst = caches(8, True), caches(8, False)
    p = make_pair(src, dst, debug_corrupt=True)
    p.register("r", [1, 2])
    assert p.pull("r", 0, [3, 4])
    for name in src:
        assert torch.equal(dst[name][3], src[name][1])
        assert not torch.equal(dst[name][4], src[name][2])  # the most recent block


def test_pull_waits_for_a_late_registration(make_pair: Any) -> None:
    p = make_pair(caches(8, True), caches(8, False))
    threading.Timer(0.3, p.register, ("late", [1])).start()
    assert p.pull("late", 0, [2])


@pytest.mark.parametrize("case", ["unknown", "engine", "range", "layout"])
def test_bad_pulls_fail_cleanly_and_keep_the_connection_usable(make_pair: Any, case: str) -> None:
    dst = caches(8, False, c=32) if case == "layout" else caches(8, False)
    p = make_pair(caches(8, True), dst, register_timeout_s=0.3)
    p.register("r", [1, 2])
    ok = {
        "unknown": lambda: p.pull("nope", 0, [3]),
        "engine": lambda: p.pull("r", 0, [3], engine="other"),
        "range": lambda: p.pull("r", 1, [3, 4]),
        "layout": lambda: p.pull("r", 0, [3]),
    }[case]()
    assert not ok
    _, recvd, failed, bad = p.done_d.drain()
    assert recvd == failed and len(recvd) == 1 and bad
    if case != "layout":
        assert p.pull("r", 0, [3, 4])  # same pooled connection, still in sync


def test_lease_expiry_frees_and_refuses_late_pulls(make_pair: Any) -> None:
    p = make_pair(caches(8, True), caches(8, False), lease_s=0.4)
    p.register("r", [1])
    waited = p.wait_sent("r", timeout=5)
    assert waited < 2.0
    assert not p.pull("r", 0, [2])  # never served from blocks that may be reused
    assert p.done_p.drain_stats().expired == 1  # type: ignore[union-attr]


def test_release_frees_now_even_before_registration(make_pair: Any) -> None:
    p = make_pair(caches(8, True), caches(8, False), lease_s=60)
    p.register("a", [1])
    p.iod.submit(p.client.release("127.0.0.1", p.port, "P", "a")).result(5)
    assert p.wait_sent("a", timeout=3) < 3
    p.iod.submit(p.client.release("127.0.0.1", p.port, "P", "b")).result(5)
    time.sleep(0.2)
    p.register("b", [2])
    assert p.wait_sent("b", timeout=3) < 3


def test_stale_pooled_connection_is_redialed(make_pair: Any) -> None:
    p = make_pair(caches(8, True), caches(8, False))
    p.register("a", [1])
    assert p.pull("a", 0, [2])
    # Restart the server on the same port (new process in real life): pooled socket is dead.
    p.iop.stop()
    p.iop = IOLoop("test-p2")
    p.server = KVServer(p.kp, None, p.cfg, "P", p.port, p.done_p)
    p.iop.submit(p.server.start()).result(5)
    p.register("b", [3])
    assert p.pull("b", 0, [4])


def _fake_server(port: int, behaviour: str) -> threading.Thread:
    """A prefill that accepts a pull and then misbehaves."""

    async def serve() -> None:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", port))
        ls.listen()
        ls.setblocking(False)
        loop = asyncio.get_running_loop()
        sock, _ = await loop.sock_accept(ls)
        sock.setblocking(False)
        await recv_frame(sock, 5)
        if behaviour == "silent":
            await asyncio.sleep(30)
        elif behaviour == "die_mid_stream":
            await send_frame(sock, {"ok": True}, 5)
            await loop.sock_sendall(sock, b"x" * 1000)
            sock.close()
        elif behaviour == "stall_mid_stream":
            await send_frame(sock, {"ok": True}, 5)
            await loop.sock_sendall(sock, b"x" * 1000)
            await asyncio.sleep(30)
        ls.close()

    t = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    t.start()
    time.sleep(0.2)
    return t


@pytest.mark.parametrize("behaviour,bound", [("silent", 3.0), ("die_mid_stream", 1.0), ("stall_mid_stream", 3.0)])
def test_dead_prefill_is_detected_in_bounded_time(behaviour: str, bound: float) -> None:
    port = next(PORTS)
    _fake_server(port, behaviour)
    cfg = PdbenchConfig(io_timeout_s=1.0, register_timeout_s=0.5, connect_timeout_s=1.0)
    kv = PagedKV(caches(8, False), 8, 16)
    done = Completions()
    io = IOLoop("test-d")
    try:
        client = KVClient(kv, None, cfg, done)
        t0 = time.monotonic()
        ok = io.submit(client.pull(PullJob("d", "r", "P", "127.0.0.1", port, 0, [1, 2], [1, 2]))).result(10)
        assert not ok and time.monotonic() - t0 < bound
        _, recvd, failed, bad = done.drain()
        assert recvd == failed == {"d"} and bad == {1, 2}
    finally:
        io.stop()


def test_refused_connection_fails_fast() -> None:
    port = next(PORTS)
    kv = PagedKV(caches(8, False), 8, 16)
    done = Completions()
    io = IOLoop("test-d")
    try:
        client = KVClient(kv, None, PdbenchConfig(), done)
        t0 = time.monotonic()
        assert not io.submit(client.pull(PullJob("d", "r", "P", "127.0.0.1", port, 0, [1], [1]))).result(10)
        assert time.monotonic() - t0 < 1.0
    finally:
        io.stop()


def test_decode_dying_mid_pull_keeps_blocks_until_the_lease(make_pair: Any) -> None:
    p = make_pair(caches(64, True, layers=4, c=128), caches(8, False), lease_s=1.5, io_timeout_s=0.5)
    p.register("r", list(range(64)))
    sock = socket.create_connection(("127.0.0.1", p.port))
    sock.setblocking(False)

    async def half_pull() -> None:
        await send_frame(sock, {"op": "pull", "req": "r", "engine": "P", "first": 0, "count": 64,
                                "layout": p.kp.signature()}, 5)
        resp = await recv_frame(sock, 5)
        assert resp["ok"]
        await asyncio.get_running_loop().sock_recv(sock, 4096)
        sock.close()  # the decode worker is killed mid-transfer

    t0 = time.monotonic()
    asyncio.run(half_pull())
    assert not p.done_p.drain()[0]  # not freed on the failure...
    waited = p.wait_sent("r", timeout=6)  # ...but at the lease
    assert 0.5 < time.monotonic() - t0 < 4.0, waited
    st = p.done_p.drain_stats()
    assert st is not None and st.failed_send == 1 and st.expired == 1


def test_idle_transport_uses_no_cpu(make_pair: Any) -> None:
    p = make_pair(caches(8, True), caches(8, False), lease_s=30)
    p.register("r", [1])
    assert p.pull("r", 0, [2])
    t0 = time.process_time()
    time.sleep(1.0)
    assert time.process_time() - t0 < 0.05  # no thread spins while idle
