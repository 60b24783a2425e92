"""The connector's transfer layer without vLLM: paged layouts, TCP pulls, leases, dead peers."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import pytest
import torch
from conftest import port_base

from connector.auth import AuthError, client_handshake, server_handshake
from connector.config import PdbenchConfig
from connector.layout import PagedKV
from connector.protocol import recv_frame, send_frame
from connector.staging import Stager
from connector.transport import Completions, IOLoop, KVClient, KVServer, PullJob

PORTS = iter(range(port_base(15660), port_base(15700)))
T = TypeVar("T")


def wait_until(pred: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def on_loop(io: IOLoop, fn: Callable[[], T]) -> T:
    """fn() run on the IO thread, where the server's state lives and changes."""

    async def call() -> T:
        return fn()

    return io.submit(call()).result(5)


def caches(
    n_blocks: int,
    fill: bool,
    layers: int = 3,
    heads: int = 2,
    bs: int = 16,
    c: int = 64,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    out = {}
    for i in range(layers):
        t = (
            torch.randn(n_blocks, heads, bs, c, generator=g).to(dtype)
            if fill
            else torch.zeros(n_blocks, heads, bs, c, dtype=dtype)
        )
        out[f"model.layers.{i}.self_attn.attn"] = t
    return out


def strided(c: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Same logical [B, H, N, C] views, heads outside blocks in memory (not block-dense)."""
    return {k: v.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3) for k, v in c.items()}


class Pair:
    """A server (prefill worker) and a client (decode worker), each on its own IO thread."""

    def __init__(
        self,
        src: dict[str, torch.Tensor],
        dst: dict[str, torch.Tensor],
        staged: bool = False,
        client_secret: bytes | str | None = "same",
        total_heads: int | None = None,
        **cfg: Any,
    ) -> None:
        self.port = next(PORTS)
        self.cfg = PdbenchConfig(port=self.port, **cfg)
        ccfg = self.cfg if client_secret == "same" else dataclasses.replace(self.cfg, secret=client_secret)
        self.kp = PagedKV(src, next(iter(src.values())).shape[0], 16, total_heads)
        self.kd = PagedKV(dst, next(iter(dst.values())).shape[0], 16, total_heads)
        sp = Stager(self.kp, 1 << 16, 3) if staged or not self.kp.host_direct else None
        sd = Stager(self.kd, 1 << 16, 3) if staged or not self.kd.host_direct else None
        self.done_p, self.done_d = Completions(), Completions()
        self.iop, self.iod = IOLoop("test-p"), IOLoop("test-d")
        self.server = KVServer(self.kp, sp, self.cfg, "P", self.port, self.done_p)
        self.iop.submit(self.server.start()).result(5)
        self.client = KVClient(self.kd, sd, ccfg, self.done_d)

    def register(self, req: str, kblocks: list[int], key: str | None = None) -> None:
        """Returns once the server holds the blocks."""
        on_loop(self.iop, lambda: self.server.register(req, kblocks, None, key))

    def wait_server(self, pred: Callable[[KVServer], object], what: str, timeout: float = 10.0) -> None:
        """Until pred(server), read on the server's IO thread, holds."""
        wait_until(lambda: on_loop(self.iop, lambda: pred(self.server)), what, timeout)

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
    p.register("r1", [5, 9, 10, 11, 20])  # prefill's blocks of the request
    assert p.pull("r1", 1, [30, 2, 3, 17])  # decode had block 0 cached; its ids differ
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
    pulled = p.iod.submit(p.client.pull(PullJob("d-late", "late", "P", "127.0.0.1", p.port, 0, [2], [2])))
    p.wait_server(lambda s: "late" in s._waiters, "the pull to wait at prefill")  # it came first
    p.register("late", [1])
    assert pulled.result(30)


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
    p.wait_sent("a")  # far inside the 60 s lease: freed by the release
    p.iod.submit(p.client.release("127.0.0.1", p.port, "P", "b")).result(5)
    p.wait_server(lambda s: "b" in s._early_release, "prefill to hear the release of b")
    p.register("b", [2])  # only after the release: prefill had never heard of b
    p.wait_sent("b")


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


class FakePrefill:
    """A prefill that accepts one pull and then misbehaves; it listens before __init__ returns,
    and `got_pull` tells that the client's pull reached it (so its failure is the misbehaviour's)."""

    def __init__(self, port: int, behaviour: str) -> None:
        self.behaviour = behaviour
        self.got_pull = threading.Event()
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", port))
        self.ls.listen()
        self.ls.setblocking(False)
        threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True).start()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            sock, _ = await asyncio.wait_for(loop.sock_accept(self.ls), 30)
            sock.setblocking(False)
            await server_handshake(sock, b"", 5)
            await recv_frame(sock, 5)
            self.got_pull.set()
            if self.behaviour != "silent":
                await send_frame(sock, {"ok": True}, 5)
                await loop.sock_sendall(sock, b"x" * 1000)
            if self.behaviour == "die_mid_stream":
                sock.close()
            else:
                await asyncio.sleep(30)
        finally:
            self.ls.close()


# (behaviour, io_timeout_s, the failure's lower and upper bound in s). A silent prefill costs
# register_timeout_s + io_timeout_s (1.5 s), one stalled mid-stream io_timeout_s; one that dies
# is seen at once, far sooner than its 10 s io_timeout_s.
@pytest.mark.parametrize(
    "behaviour,io_timeout,low,high",
    [("silent", 1.0, 1.4, 5.0), ("die_mid_stream", 10.0, 0.0, 5.0), ("stall_mid_stream", 1.0, 0.9, 5.0)],
)
def test_dead_prefill_is_detected_in_bounded_time(behaviour: str, io_timeout: float, low: float, high: float) -> None:
    port = next(PORTS)
    srv = FakePrefill(port, behaviour)
    cfg = PdbenchConfig(io_timeout_s=io_timeout, register_timeout_s=0.5, connect_timeout_s=1.0)
    kv = PagedKV(caches(8, False), 8, 16)
    done = Completions()
    io = IOLoop("test-d")
    try:
        client = KVClient(kv, None, cfg, done)
        t0 = time.monotonic()
        ok = io.submit(client.pull(PullJob("d", "r", "P", "127.0.0.1", port, 0, [1, 2], [1, 2]))).result(30)
        took = time.monotonic() - t0
        assert srv.got_pull.is_set()  # it failed on the misbehaviour, not on the way there
        assert not ok and low <= took < high, took
        _, recvd, failed, bad = done.drain()
        assert recvd == failed == {"d"} and bad == {1, 2}
    finally:
        io.stop()


def test_refused_connection_fails_fast() -> None:
    port = next(PORTS)
    with socket.socket() as probe:  # nothing listens there
        assert probe.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED
    kv = PagedKV(caches(8, False), 8, 16)
    done = Completions()
    io = IOLoop("test-d")
    try:
        client = KVClient(kv, None, PdbenchConfig(), done)
        t0 = time.monotonic()
        assert not io.submit(client.pull(PullJob("d", "r", "P", "127.0.0.1", port, 0, [1], [1]))).result(30)
        assert time.monotonic() - t0 < 3.0  # not the 5 s connect_timeout_s
    finally:
        io.stop()


def test_decode_dying_mid_pull_keeps_blocks_a_lease_from_the_failure(make_pair: Any) -> None:
    lease = 3.0  # io_timeout_s 5: the pull fails on decode's close, not on a wait for its ack
    p = make_pair(caches(64, True, layers=4, c=128), caches(8, False), lease_s=lease, io_timeout_s=5.0)
    p.register("r", list(range(64)))
    registered = time.monotonic()
    # The pull fails late in the first lease, where a lease still counted from the registration
    # would end half a lease after the failure.
    while time.monotonic() < registered + lease / 2:
        time.sleep(0.01)
    sock = socket.create_connection(("127.0.0.1", p.port))
    sock.setblocking(False)

    async def half_pull() -> float:
        await client_handshake(sock, b"", 5)
        await send_frame(
            sock, {"op": "pull", "req": "r", "engine": "P", "first": 0, "count": 64, "layout": p.kp.signature()}, 5
        )
        resp = await recv_frame(sock, 5)
        assert resp["ok"]
        await asyncio.get_running_loop().sock_recv(sock, 4096)
        closed = time.monotonic()
        sock.close()  # the decode worker is killed mid-transfer
        return closed

    closed = asyncio.run(half_pull())
    wait_until(lambda: p.done_p.stats.failed_send == 1, "prefill to see the pull fail")
    assert not p.done_p.drain()[0]  # not freed on the failure...
    p.wait_sent("r", timeout=lease + 5)  # ...but a whole lease after it
    assert lease <= time.monotonic() - closed < lease + 3
    st = p.done_p.drain_stats()
    assert st is not None and st.failed_send == 1 and st.expired == 1


def thread_cpu(io: IOLoop) -> float:
    """CPU seconds the IO thread has used (its own clock: other threads and processes do not count)."""
    assert io._thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(io._thread.ident))


def test_idle_transport_uses_no_cpu(make_pair: Any) -> None:
    p = make_pair(caches(8, True), caches(8, False), lease_s=30)
    p.register("r", [1])
    assert p.pull("r", 0, [2])
    # The clock counts the IO thread's work: 0.1 s of CPU spent on it shows.
    before = thread_cpu(p.iop)

    def spin() -> None:
        t = time.thread_time()
        while time.thread_time() - t < 0.1:
            pass

    on_loop(p.iop, spin)
    assert thread_cpu(p.iop) - before >= 0.1
    t0 = {io: thread_cpu(io) for io in (p.iop, p.iod)}
    time.sleep(1.0)  # the idle period measured
    used = {io._thread.name: thread_cpu(io) - t0[io] for io in (p.iop, p.iod)}
    assert all(s < 0.05 for s in used.values()), used  # neither IO thread spins while idle


# -- network exposure: the address the job chose, and the job secret ---------------------------

SECRET = b"0123456789abcdef0123456789abcdef"


def test_pull_with_the_job_secret_is_served(make_pair: Any) -> None:
    src, dst = caches(8, True), caches(8, False)
    p = make_pair(src, dst, secret=SECRET)
    p.register("r", [1, 2])
    assert p.pull("r", 0, [3, 4])
    for name in src:
        assert torch.equal(dst[name][[3, 4]], src[name][[1, 2]])


@pytest.mark.parametrize("client_secret", [None, b"wrong-secret-wrong-secret-wrong!"])
def test_pull_without_the_job_secret_is_refused_and_gets_no_data(
    make_pair: Any, client_secret: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    src, dst = caches(8, True), caches(8, False)
    p = make_pair(src, dst, secret=SECRET, client_secret=client_secret)
    p.register("r", [1, 2])
    with caplog.at_level(logging.WARNING, logger="connector.transport"):
        assert not p.pull("r", 0, [3, 4])
        deadline = time.monotonic() + 5
        while "refused a KV connection" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
    assert "refused a KV connection from 127.0.0.1" in caplog.text
    assert all(not t.any() for t in dst.values())  # not a byte of KV
    _, recvd, failed, bad = p.done_d.drain()
    assert recvd == failed == {"d-r"} and bad == {3, 4}
    assert not p.done_p.drain()[0]  # prefill still holds the blocks for the real decoder
    good = KVClient(p.kd, None, p.cfg, Completions())
    job = PullJob("d-r2", "r", "P", "127.0.0.1", p.port, 0, [3, 4], [3, 4])
    assert p.iod.submit(good.pull(job)).result(10)


def _raw_exchange(port: int, first: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    """Connect, read the challenge, send `first` instead of a valid proof, read to EOF."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.setblocking(False)

        async def go() -> tuple[dict[str, Any], dict[str, Any], bytes]:
            challenge = await recv_frame(s, 5)
            await send_frame(s, first, 5)
            answer = await recv_frame(s, 5)
            rest = b""
            while chunk := await asyncio.get_running_loop().sock_recv(s, 65536):
                rest += chunk
            return challenge, answer, rest

        return asyncio.run(go())


@pytest.mark.parametrize(
    "first",
    [
        {"op": "pull", "req": "r", "engine": "P", "first": 0, "count": 2},  # no handshake at all
        {"op": "auth", "nonce": "00" * 16, "mac": "00" * 32},  # a guessed proof
        {"op": "auth", "nonce": "00" * 16, "mac": 12345},  # wrong type
    ],
)
def test_a_peer_that_skips_or_fakes_the_handshake_is_closed_without_data(make_pair: Any, first: dict[str, Any]) -> None:
    p = make_pair(caches(8, True), caches(8, False), secret=SECRET)
    p.register("r", [1, 2])
    challenge, answer, rest = _raw_exchange(
        p.port, {**first, "layout": p.kp.signature()} if first["op"] == "pull" else first
    )
    assert challenge["op"] == "challenge" and "nonce" in challenge
    assert answer == {"ok": False, "error": "authentication failed"}
    assert rest == b""  # then closed: no KV bytes
    assert p.pull("r", 0, [3, 4])  # the real decoder is still served


def test_decode_refuses_a_server_that_does_not_know_the_secret(make_pair: Any) -> None:
    # Mutual: a squatter on the port cannot feed decode KV either.
    port = next(PORTS)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen()

    def squat() -> None:
        conn, _ = ls.accept()
        conn.setblocking(False)

        async def lie() -> None:
            await send_frame(conn, {"op": "challenge", "v": 1, "nonce": "ab" * 16}, 5)
            await recv_frame(conn, 5)
            await send_frame(conn, {"ok": True, "mac": "cd" * 32}, 5)  # accepts anyone, proves nothing

        asyncio.run(lie())
        conn.close()

    threading.Thread(target=squat, daemon=True).start()
    io = IOLoop("test-d")
    try:

        async def dial() -> None:
            client = KVClient(PagedKV(caches(8, False), 8, 16), None, PdbenchConfig(secret=SECRET), Completions())
            await client._connect("127.0.0.1", port)

        with pytest.raises(AuthError, match="could not prove"):
            io.submit(dial()).result(10)
    finally:
        io.stop()
        ls.close()


def test_server_listens_only_on_the_chosen_address(make_pair: Any) -> None:
    # 127.0.0.2 is a second local address on Linux (all of 127/8 is loopback).
    p = make_pair(caches(8, True), caches(8, False), host="127.0.0.2")
    assert p.server._lsock.getsockname() == ("127.0.0.2", p.port)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", p.port), timeout=2).close()
    p.register("r", [1])
    job = PullJob("d-r", "r", "P", "127.0.0.2", p.port, 0, [2], [2])
    assert p.iod.submit(p.client.pull(job)).result(10)


def test_bind_host_overrides_the_advertised_address() -> None:
    cfg = PdbenchConfig(host="10.1.2.3", bind_host="127.0.0.1")
    assert (cfg.advertised_host(), cfg.listen_host()) == ("10.1.2.3", "127.0.0.1")
    assert PdbenchConfig(host="10.1.2.3").listen_host() == "10.1.2.3"
    assert PdbenchConfig().listen_host() == "127.0.0.1"


def test_without_a_secret_the_server_refuses_to_listen_beyond_loopback() -> None:
    io = IOLoop("test-p")
    try:
        kv = PagedKV(caches(8, True), 8, 16)
        srv = KVServer(kv, None, PdbenchConfig(bind_host="0.0.0.0"), "P", next(PORTS), Completions())
        with pytest.raises(RuntimeError, match="only listen on loopback"):
            io.submit(srv.start()).result(5)
        # With a secret, any address the job chose is allowed.
        port = next(PORTS)
        srv = KVServer(kv, None, PdbenchConfig(bind_host="0.0.0.0", secret=SECRET), "P", port, Completions())
        io.submit(srv.start()).result(5)
        assert srv._lsock is not None and srv._lsock.getsockname() == ("0.0.0.0", port)
    finally:
        io.stop()


def test_settings_only_from_extra_config(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The environment holds nothing the connector reads: the rendered kv-transfer-config is the whole truth.
    f = tmp_path / "s"
    f.write_bytes(SECRET + b"\n")
    f.chmod(0o600)
    for var, value in (
        ("PDBENCH_KV_SECRET_FILE", str(f)),
        ("PDBENCH_KV_PORT", "9999"),
        ("PDBENCH_NODE_ADDR", "10.9.9.9"),
        ("RUN_DIR", str(tmp_path)),
    ):
        monkeypatch.setenv(var, value)
    cfg = PdbenchConfig.from_extra({"host": "127.0.0.1"})
    assert cfg.secret is None and cfg.port == 17600 and cfg.host == "127.0.0.1"
    cfg = PdbenchConfig.from_extra({"host": "10.0.0.2", "port": "5600", "secret_file": str(f), "lease_s": 300})
    assert (cfg.host, cfg.port, cfg.lease_s, cfg.secret) == ("10.0.0.2", 5600, 300.0, SECRET)
    assert SECRET.decode() not in repr(cfg)
    # Unknown keys are errors naming the key and what is accepted; the secret never travels inline.
    for bad in ("secret", "kv_lease_duration", "prot"):
        with pytest.raises(ValueError, match=f"unknown kv_connector_extra_config key.*{bad}.*accepted: host, port"):
            PdbenchConfig.from_extra({bad: "x"})
    # A file that was configured must be usable: fail at startup, not at the first pull.
    with pytest.raises(ValueError, match="cannot read"):
        PdbenchConfig.from_extra({"secret_file": str(tmp_path / "missing")})
    (tmp_path / "short").write_text("abc")
    with pytest.raises(ValueError, match="shorter"):
        PdbenchConfig.from_extra({"secret_file": str(tmp_path / "short")})


def test_ensure_job_secret_is_private_idempotent_and_race_safe(tmp_path: Any) -> None:
    from harness.node.secrets import ensure_job_secret

    path = ensure_job_secret(tmp_path)
    assert path == tmp_path / "state" / "kv_secret"
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    assert len(text.strip()) == 64 and ensure_job_secret(tmp_path).read_text() == text
    # Nodes racing on a shared run directory all end up with one secret.
    code = (
        "import sys; from harness.node.secrets import ensure_job_secret; "
        "print(ensure_job_secret(sys.argv[1]).read_text().strip())"
    )
    run = tmp_path / "race"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True) for _ in range(6)
    ]
    outs = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(outs) == 1 and outs == {(run / "state" / "kv_secret").read_text().strip()}
    assert sorted(os.listdir(run / "state")) == ["kv_secret"]  # no temporary files left


def test_connector_imports_nothing_of_harness() -> None:
    code = (
        "import sys, connector.transport, connector.config, connector.auth, connector.protocol; "
        "bad = [m for m in sys.modules if m == 'harness' or m.startswith('harness.')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- differing TP: head ranges -----------------------------------------------------------


def test_head_ranges_of_a_dense_block_are_zero_copy_views() -> None:
    c = caches(6, True, heads=4)
    kv = PagedKV(c, 6, 16)
    views = kv.host_runs(1, [2, 5], 1 << 30, heads=(1, 3))
    assert [len(v) for v in views] == [kv.block_bytes[1] // 2] * 2 == [kv.unit_bytes(1, (1, 3))] * 2
    t = c["model.layers.1.self_attn.attn"]
    assert bytes(views[1]) == t[5, 1:3].contiguous().numpy().tobytes()
    assert kv.heads_error([0, 4]) is None
    assert kv.heads_error([3, 3]) and kv.heads_error([0, 5]) and kv.heads_error("0:2")


@pytest.mark.parametrize("kind", ["direct", "strided", "staged"])
def test_a_head_range_lands_in_the_decoders_own_heads(make_pair: Any, kind: str) -> None:
    """Prefill TP 1 (4 heads) into a decode rank of TP 2 (2 heads): its heads 2..3 only."""
    src, dst = caches(12, True, heads=4), caches(10, False, heads=2)
    if kind == "strided":
        src, dst = strided(src), strided(dst)
    p = make_pair(src, dst, staged=kind == "staged", total_heads=4)
    p.register("r", [3, 4, 9])
    job = PullJob("d-r", "r", "P", "127.0.0.1", p.port, 0, [7, 1, 2], [7, 1, 2], heads=(2, 4), local_heads=(0, 2))
    assert p.iod.submit(p.client.pull(job)).result(30)
    for name in src:
        assert torch.equal(dst[name][[7, 1, 2]], src[name][[3, 4, 9], 2:4])
        assert not dst[name][[0, 3, 4, 5, 6, 8, 9]].any()
    p.wait_sent("r")  # one reader announced: freed on its ack
    st = p.done_d.drain_stats()
    assert st is not None and st.recv_bytes == [3 * 3 * p.kd.block_bytes[0]]


def test_prefill_frees_only_after_every_reader_acked(make_pair: Any) -> None:
    src, dst = caches(8, True, heads=4), caches(8, False, heads=2)
    p = make_pair(src, dst, total_heads=4)
    p.register("r", [1, 2])

    def pull(reader: int) -> bool:
        a = 2 * reader
        job = PullJob("d", "r", "P", "127.0.0.1", p.port, 0, [5, 6], [5, 6], (a, a + 2), (0, 2), reader, 2)
        return bool(p.iod.submit(p.client.pull(job)).result(30))

    assert pull(0)
    # Prefill took reader 0's ack (or, wrongly, freed the request on it).
    p.wait_server(lambda s: "r" not in s._entries or s._entries["r"].acked == {0}, "reader 0's ack")
    assert "r" not in p.done_p.drain()[0]  # reader 1 has not pulled yet
    for name in src:
        assert torch.equal(dst[name][[5, 6]], src[name][[1, 2], 0:2])
    assert not pull(0)  # a reader pulls once
    assert pull(1)
    for name in src:
        assert torch.equal(dst[name][[5, 6]], src[name][[1, 2], 2:4])
    p.wait_sent("r")


@pytest.mark.parametrize("case", ["outside", "model", "shape", "readers"])
def test_bad_head_pulls_are_refused(make_pair: Any, case: str) -> None:
    src = caches(8, True, heads=4)
    dst = caches(8, False, heads=2, c=32 if case == "shape" else 64)
    p = make_pair(src, dst, total_heads=4, register_timeout_s=0.3)
    if case == "model":  # the two sides disagree on the model's head count
        p.client._sig = {**p.client._sig, "total_heads": 8}
    p.register("r", [1])
    heads, readers = ((3, 5), 1) if case == "outside" else ((0, 2), 1)
    if case == "readers":
        first = PullJob("d", "r", "P", "127.0.0.1", p.port, 0, [2], [2], (0, 2), (0, 2), 0, 2)
        assert p.iod.submit(p.client.pull(first)).result(30)
        heads, readers = (2, 4), 3  # a second reader that counts differently
    lh = (0, heads[1] - heads[0])
    job = PullJob("d", "r", "P", "127.0.0.1", p.port, 0, [3], [3], heads, lh, 1 if readers > 1 else 0, readers)
    assert not p.iod.submit(p.client.pull(job)).result(30)
    assert not dst["model.layers.0.self_attn.attn"][3].any()


def test_a_pull_job_with_unequal_head_ranges_is_refused() -> None:
    with pytest.raises(ValueError, match="do not match"):
        PullJob("d", "r", "P", "h", 1, 0, [1], [1], heads=(0, 2), local_heads=(0, 1))
    with pytest.raises(ValueError, match="do not match"):
        PullJob("d", "r", "P", "h", 1, 0, [1], [1], heads=(0, 2))


# -- the overlapped flow: decode asks before prefill finished, by the proxy's key ------------


def test_an_early_pull_waits_for_prefill_and_finds_the_blocks_by_the_proxys_key(make_pair: Any) -> None:
    src, dst = caches(8, True), caches(8, False)
    p = make_pair(src, dst, register_timeout_s=0.2)  # an early pull waits longer: its own wait_s
    job = PullJob("d", "pd-key", "P", "127.0.0.1", p.port, 0, [5, 6], [5, 6], wait_s=10.0)
    pulled = p.iod.submit(p.client.pull(job))
    p.wait_server(lambda s: "pd-key" in s._waiters, "the early pull to wait at prefill")
    with pytest.raises(FutureTimeout):
        pulled.result(1.0)  # still waiting at five times register_timeout_s
    p.register("vllm-id-1", [2, 3], key="pd-key")
    assert pulled.result(30)
    for name in src:
        assert torch.equal(dst[name][[5, 6]], src[name][[2, 3]])
    p.wait_sent("vllm-id-1")  # reported to vLLM under its own id
    late = PullJob("d", "pd-none", "P", "127.0.0.1", p.port, 0, [5], [5], wait_s=0.5)
    t0 = time.monotonic()
    assert not p.iod.submit(p.client.pull(late)).result(30)  # never registered: bounded wait
    assert 0.5 <= time.monotonic() - t0 < 5  # its wait_s, not register_timeout_s, nor unbounded


def test_a_release_by_key_frees_the_request_under_vllms_id(make_pair: Any) -> None:
    p = make_pair(caches(8, True), caches(8, False), lease_s=60)
    p.iod.submit(p.client.release("127.0.0.1", p.port, "P", "pd-k")).result(5)
    p.wait_server(lambda s: "pd-k" in s._early_release, "prefill to hear the release")
    p.register("vllm-id-2", [1], key="pd-k")
    p.wait_sent("vllm-id-2")  # far inside the 60 s lease: freed by the release


def test_the_transfer_thread_gets_the_configured_cpu_weight() -> None:
    io = IOLoop("test-nice", -5)
    try:
        on_loop(io, lambda: None)  # the loop runs: the thread has set its priority, or failed to
        tid = io._thread.native_id
        assert tid is not None
        if io.nice is None:  # no CAP_SYS_NICE here: the thread keeps the process's value
            assert os.getpriority(os.PRIO_PROCESS, tid) == os.getpriority(os.PRIO_PROCESS, 0)
        else:
            assert io.nice == os.getpriority(os.PRIO_PROCESS, tid) == -5
            assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != -5  # only that thread
    finally:
        io.stop()
    assert PdbenchConfig().io_nice == -10
