"""TCP transfer of paged KV between a prefill worker (server) and a decode worker (client).

One asyncio loop per worker runs on its own thread; every wait is a socket or
timer wait in the kernel, so nothing polls. The model thread only enqueues work
(`IOLoop.call`/`submit`) and drains finished ids from `Completions`.

Prefill keeps a request's blocks until decode acks its pull, releases it, or the
lease expires; expiry never happens during a pull, a failed pull starts a new
lease, and a pull after expiry is refused instead of reading reused blocks. Every wait on a peer is bounded
(connect, first response, per-chunk progress, ack), so a dead peer costs at most
`io_timeout_s` (sooner when the kernel reports the reset); so is every wait on a
device copy or a staging ring (connector/staging.py), whatever the transfer's size.

On one host with CUDA caches on both sides, the bytes move GPU to GPU through CUDA
IPC (connector/ipc.py) instead: the same pull/ok/ack, leases and failure handling,
with prefill's `ok` carrying its block ids and decode copying before it acks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

from connector import ipc
from connector.auth import AuthError, client_handshake, server_handshake
from connector.config import PdbenchConfig
from connector.layout import Heads, PagedKV, signature_mismatch
from connector.protocol import PeerError, recv_frame, recv_views, send_frame, send_views, tune
from connector.staging import Stager, direct_sink, direct_source

log = logging.getLogger(__name__)

_GONE_MAX = 65536  # remembered finished ids, to refuse late pulls with a clear error


class TransferError(Exception):
    pass


@dataclass
class TransferStats:
    """Observations since the last drain; lists hold one entry per transfer."""

    recv_bytes: list[int] = field(default_factory=list)
    recv_s: list[float] = field(default_factory=list)
    recv_wait_s: list[float] = field(default_factory=list)
    send_bytes: list[int] = field(default_factory=list)
    send_s: list[float] = field(default_factory=list)
    failed_recv: int = 0
    failed_send: int = 0
    expired: int = 0
    released: int = 0
    # Which path each completed transfer took.
    recv_ipc: int = 0
    recv_tcp: int = 0
    send_ipc: int = 0
    send_tcp: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def empty(self) -> bool:
        return not any(self.__dict__.values())

    def count_path(self, side: str, via_ipc: bool) -> None:
        name = f"{side}_{'ipc' if via_ipc else 'tcp'}"
        setattr(self, name, getattr(self, name) + 1)


@dataclass(frozen=True)
class PullTiming:
    """One pull on the decode worker's clock (connector/timings.py)."""

    nbytes: int
    pull_s: float  # pull request sent -> ack sent
    wait_s: float  # pull request sent -> prefill's answer
    via_ipc: bool


class Completions:
    """Thread-safe hand-off of finished transfers from the IO thread to the model thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: set[str] = set()
        self._recvd: set[str] = set()
        self._failed: set[str] = set()
        self._bad_blocks: set[int] = set()
        self._pulled: dict[str, tuple[bool, list[PullTiming]]] = {}
        self.stats = TransferStats()

    def sent(self, req_id: str) -> None:
        with self._lock:
            self._sent.add(req_id)

    def received(self, req_id: str, ok: bool, block_ids: list[int], timings: list[PullTiming] | None = None) -> None:
        with self._lock:
            self._recvd.add(req_id)
            if timings is not None:
                self._pulled[req_id] = (ok, timings)
            if not ok:
                self._failed.add(req_id)
                self._bad_blocks.update(block_ids)

    def record(self, fn: Any) -> None:
        with self._lock:
            fn(self.stats)

    def drain(self) -> tuple[set[str], set[str], set[str], set[int]]:
        with self._lock:
            out = (self._sent, self._recvd, self._failed, self._bad_blocks)
            self._sent, self._recvd, self._failed, self._bad_blocks = set(), set(), set(), set()
            return out

    def drain_pulls(self) -> dict[str, tuple[bool, list[PullTiming]]]:
        """Each finished load's outcome and the timings of its successful pulls."""
        with self._lock:
            out, self._pulled = self._pulled, {}
            return out

    def drain_stats(self) -> TransferStats | None:
        with self._lock:
            if self.stats.empty():
                return None
            out, self.stats = self.stats, TransferStats()
            return out


class IOLoop:
    """An event loop on a daemon thread (it inherits the creating thread's CPU affinity).

    `nice` < 0 raises the thread's CPU weight over its neighbours (CAP_SYS_NICE needed; without
    it the thread keeps the process's nice value): vLLM's model thread busy-polls its queue for
    a while after every step, on the same core, exactly when a finished prefill is pulled."""

    def __init__(self, name: str, nice: int = 0) -> None:
        self.loop = asyncio.new_event_loop()
        self.nice: int | None = None  # the thread's nice value once set; None: not changed
        self._want_nice = nice
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._want_nice:
            try:  # Linux: a thread id is a PRIO_PROCESS target of its own
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self._want_nice)
                self.nice = self._want_nice
            except OSError as exc:
                log.info("pdbench: transfer thread keeps its priority (nice %d refused: %s)", self._want_nice, exc)
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 5.0) -> None:
        if not self.loop.is_running():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.submit(_cancel_all()).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)


def _source(
    kv: PagedKV, stager: Stager | None, kblocks: list[int], cfg: PdbenchConfig, ready: Any, heads: Heads | None
) -> AsyncIterator[list[memoryview]]:
    if stager is None:
        return direct_source(kv, kblocks, cfg.chunk_bytes, heads)
    return stager.source(kblocks, ready, heads)


def _sink(
    kv: PagedKV, stager: Stager | None, kblocks: list[int], cfg: PdbenchConfig, heads: Heads | None
) -> AsyncIterator[list[memoryview]]:
    if stager is None:
        return direct_sink(kv, kblocks, cfg.chunk_bytes, cfg.debug_corrupt, heads)
    return stager.sink(kblocks, cfg.debug_corrupt, heads)


# Decode ranks that may read one prefill rank's request (decode TP / prefill TP, bounded).
_MAX_READERS = 64


@dataclass
class _Entry:
    req_id: str  # vLLM's id, reported as sent; the entry itself is found by its name
    kblocks: list[int]
    deadline: float
    ready: Any = None
    readers: int = 0  # decode ranks that will pull (from the first pull; 0: none yet)
    active: set[int] = field(default_factory=set)  # readers pulling now
    acked: set[int] = field(default_factory=set)  # readers done; all of them: blocks freed

    @property
    def sending(self) -> bool:
        return bool(self.active)


class KVServer:
    """Prefill side: holds finished requests' blocks and streams them to pulling decoders."""

    def __init__(
        self, kv: PagedKV, stager: Stager | None, cfg: PdbenchConfig, engine_id: str, port: int, done: Completions
    ) -> None:
        self.kv, self.stager, self.cfg, self.engine_id = kv, stager, cfg, engine_id
        self.port, self.done = port, done
        self._entries: dict[str, _Entry] = {}
        self._gone: OrderedDict[str, str] = OrderedDict()  # req -> why it is no longer served
        self._early_release: OrderedDict[str, None] = OrderedDict()
        self._waiters: dict[str, asyncio.Event] = {}
        self._sig = kv.signature()
        self._lsock: socket.socket | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # Exported here, on the model thread (see connector/ipc.py); None: TCP only.
        self.ipc = ipc.Export.build(kv) if cfg.ipc and stager is not None else None

    async def start(self) -> None:
        """Listen on the one address the job chose (cfg.listen_host(): the node's address)."""
        host = self.cfg.listen_host()
        ls = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            ls.bind((host, self.port))
        except OSError as exc:
            ls.close()
            raise RuntimeError(
                f"pdbench connector: cannot listen on {host}:{self.port}: {exc} "
                "(host/bind_host must be an address of this machine)"
            ) from exc
        bound = ls.getsockname()[0]
        if self.cfg.secret is None and not _is_loopback(bound):
            # Anyone who can reach the port could read any held request's KV: without
            # a job secret, serve only this machine (benchmarks/devpair.py and the unit tests do).
            ls.close()
            raise RuntimeError(
                f"pdbench connector: no job secret, so the KV server may only listen on loopback, "
                f"not {bound}; write a random secret (>= 16 bytes, mode 0600) to a file both sides "
                f"can read and give it as kv_connector_extra_config secret_file "
                f"(pdbench jobs: RUN_DIR/state/kv_secret)"
            )
        if self.cfg.secret is None:
            log.warning("pdbench KV server: no job secret configured; listening on loopback %s only", bound)
        ls.listen(256)
        ls.setblocking(False)
        self._lsock = ls
        self._spawn(self._accept_loop())
        self._spawn(self._reap_loop())
        log.info(
            "pdbench KV server listening on %s:%d; peers must prove the job secret (%s)",
            bound,
            self.port,
            self.cfg.secret_file or ("given" if self.cfg.secret else "none: empty key, loopback only"),
        )

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- called on the loop thread (via IOLoop.call) ----------------------------

    def register(self, req_id: str, kblocks: list[int], ready: Any = None, key: str | None = None) -> None:
        """Hold `req_id`'s blocks for decode, which asks for them by `key` (the proxy's pull
        key) or, without one, by `req_id`."""
        now = asyncio.get_running_loop().time()
        name = key or req_id
        self._entries[name] = _Entry(req_id, kblocks, now + self.cfg.lease_s, ready)
        if name in self._early_release:
            del self._early_release[name]
            self._finish(name, "released")
            return
        waiter = self._waiters.pop(name, None)
        if waiter is not None:
            waiter.set()

    def _finish(self, name: str, why: str) -> None:
        e = self._entries.pop(name, None)
        self._gone[name] = why
        while len(self._gone) > _GONE_MAX:
            self._gone.popitem(last=False)
        if e is not None:
            self.done.sent(e.req_id)

    # -- loop tasks ---------------------------------------------------------------

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._lsock is not None
        try:
            while True:
                sock, _ = await loop.sock_accept(self._lsock)
                tune(
                    sock,
                    self.cfg.keepalive_idle_s,
                    self.cfg.keepalive_interval_s,
                    self.cfg.keepalive_count,
                    self.cfg.sock_buf_bytes,
                )
                self._spawn(self._serve(sock))
        finally:
            self._lsock.close()

    async def _reap_loop(self) -> None:
        loop = asyncio.get_running_loop()
        tick = max(0.05, min(1.0, self.cfg.lease_s / 4))
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            for req_id, e in list(self._entries.items()):
                if not e.sending and e.deadline <= now:
                    log.warning(
                        "pdbench: lease of %s expired after %.0f s without a pull; freeing its blocks",
                        req_id,
                        self.cfg.lease_s,
                    )
                    self._finish(req_id, "lease expired")
                    self.done.record(lambda s: setattr(s, "expired", s.expired + 1))

    async def _serve(self, sock: socket.socket) -> None:
        try:
            peer = "{}:{}".format(*sock.getpeername()[:2])
        except OSError:
            peer = "?"
        try:
            # Nothing else is read or sent before the peer proved it knows the job secret.
            await server_handshake(sock, self.cfg.secret or b"", self.cfg.io_timeout_s)
        except (AuthError, PeerError, OSError, TimeoutError, ValueError) as exc:
            log.warning("pdbench: refused a KV connection from %s: %s", peer, exc)
            sock.close()
            return
        except BaseException:
            sock.close()
            raise
        try:
            while True:
                # An idle pooled connection may wait forever; keepalive bounds a dead host.
                msg = await recv_frame(sock, None)
                op = msg.get("op")
                if op == "pull":
                    await self._pull(sock, msg)
                elif op == "release":
                    self._release(str(msg.get("req")), msg.get("engine"))
                elif op == "ipc_hello":
                    await send_frame(sock, self._ipc_hello(msg), self.cfg.io_timeout_s)
                else:
                    raise PeerError(f"unknown op {op!r}")
        except (PeerError, OSError, TimeoutError, ValueError) as exc:
            log.debug("pdbench: connection closed: %s", exc)
        except Exception:
            log.exception("pdbench: KV server connection failed")
        finally:
            sock.close()

    def _ipc_hello(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.ipc is None:
            return {"ok": False, "error": "CUDA IPC is off or unavailable on this prefill"}
        return self.ipc.hello(msg.get("boot_id"))

    def _release(self, req_id: str, engine: Any) -> None:
        if engine != self.engine_id:
            return
        e = self._entries.get(req_id)
        if e is not None and not e.sending:
            self._finish(req_id, "released")
            self.done.record(lambda s: setattr(s, "released", s.released + 1))
        elif e is None and req_id not in self._gone:
            # Decode gave up before this worker heard of the request: free it on arrival.
            self._early_release[req_id] = None
            while len(self._early_release) > _GONE_MAX:
                self._early_release.popitem(last=False)

    async def _lookup(self, req_id: str, wait_s: float) -> _Entry | str:
        e = self._entries.get(req_id)
        if e is not None:
            return e
        if req_id in self._gone:
            return f"request {req_id} is no longer held ({self._gone[req_id]})"
        # The pull raced the engine step that tells this worker about the request, or
        # (overlapped flow) prefill has not finished it yet.
        waiter = self._waiters.setdefault(req_id, asyncio.Event())
        try:
            await asyncio.wait_for(waiter.wait(), wait_s)
        except TimeoutError:
            self._waiters.pop(req_id, None)
            return f"request {req_id} unknown to this prefill worker"
        e = self._entries.get(req_id)
        return e if e is not None else f"request {req_id} is no longer held"

    async def _find(self, msg: dict[str, Any], req_id: str, first: int, count: int) -> _Entry | str:
        """The entry a pull may read, or why not."""
        if msg.get("engine") != self.engine_id:
            return f"engine id {msg.get('engine')} is not this prefill ({self.engine_id})"
        wait_s = self.cfg.register_timeout_s
        asked = msg.get("wait_s")
        if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
            wait_s = max(wait_s, min(float(asked), self.cfg.lease_s))  # never beyond a lease
        found = await self._lookup(req_id, wait_s)
        if isinstance(found, str):
            return found
        heads, reader, readers = msg.get("heads"), msg.get("reader", 0), msg.get("readers", 1)
        err = signature_mismatch(self._sig, msg.get("layout") or {}, heads is not None) or self.kv.heads_error(heads)
        if err is None and (first < 0 or count < 0 or first + count > len(found.kblocks)):
            err = f"blocks [{first}, {first + count}) outside the {len(found.kblocks)} held"
        if err is None and not (type(reader) is int and type(readers) is int and 0 <= reader < readers <= _MAX_READERS):
            err = f"reader {reader!r} of {readers!r} is not an index below a count of at most {_MAX_READERS}"
        if err is None and found.readers and readers != found.readers:
            err = f"{readers} readers announced, an earlier pull said {found.readers}"
        if err is None and reader in found.active:
            err = "request is already being pulled"
        if err is None and reader in found.acked:
            err = f"reader {reader} already pulled this request"
        if err is None and msg.get("path") == "ipc" and (self.ipc is None or msg.get("token") != self.ipc.token):
            err = "CUDA IPC is not offered by this prefill"
        if err is None and msg.get("path") == "ipc" and heads is not None:
            err = "CUDA IPC moves whole blocks only"
        return err if err is not None else found

    async def _offer_ipc(self, sock: socket.socket, ready: Any, kblocks: list[int]) -> None:
        """Decode reads the blocks as soon as it hears ok: the KV must be written by then."""
        assert self.stager is not None
        await self.stager.wait_ready(ready)
        await send_frame(sock, {"ok": True, "blocks": kblocks}, self.cfg.io_timeout_s)

    async def _pull(self, sock: socket.socket, msg: dict[str, Any]) -> None:
        req_id = str(msg.get("req"))
        first, count = int(msg.get("first", 0)), int(msg.get("count", 0))
        via_ipc = msg.get("path") == "ipc"
        found = await self._find(msg, req_id, first, count)
        if isinstance(found, str):
            await send_frame(sock, {"ok": False, "error": found}, self.cfg.io_timeout_s)
            return
        entry = found
        reader, heads = msg.get("reader", 0), msg.get("heads")
        entry.readers = msg.get("readers", 1)
        entry.active.add(reader)
        kblocks = entry.kblocks[first : first + count]
        t0, sent, ok, why = time.perf_counter(), 0, False, "cancelled"
        try:
            if via_ipc:
                await self._offer_ipc(sock, entry.ready, kblocks)
            else:
                await send_frame(sock, {"ok": True}, self.cfg.io_timeout_s)
                src = _source(self.kv, self.stager, kblocks, self.cfg, entry.ready, heads)
                async with contextlib.aclosing(src) as chunks:  # type: ignore[type-var]  # an async generator
                    async for batch in chunks:
                        sent += await send_views(sock, batch, self.cfg.io_timeout_s)
            dt = time.perf_counter() - t0
            ack = await recv_frame(sock, self.cfg.io_timeout_s)
            if ack.get("op") != "ack" or ack.get("req") != req_id:
                raise PeerError(f"expected ack for {req_id}, got {ack}")
            if via_ipc:  # decode copied every block before it acked
                sent, dt = len(kblocks) * sum(self.kv.block_bytes), time.perf_counter() - t0
            ok = True
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            entry.active.discard(reader)
            if ok:
                entry.acked.add(reader)
                if len(entry.acked) >= entry.readers:
                    self._finish(req_id, "acked")
                self.done.record(
                    lambda s: (s.send_bytes.append(sent), s.send_s.append(dt), s.count_path("send", via_ipc))
                )
            else:
                # Keep the blocks for a whole lease from now: the decoder may be slow, not dead,
                # and may pull again; a pull late in the lease must not leave it no time to.
                entry.deadline = max(entry.deadline, asyncio.get_running_loop().time() + self.cfg.lease_s)
                log.warning(
                    "pdbench: pull of %s failed after %s (%s); blocks kept for another lease",
                    req_id,
                    "the CUDA IPC offer" if via_ipc else f"{sent} bytes",
                    why,
                )
                self.done.record(lambda s: setattr(s, "failed_send", s.failed_send + 1))


def _within(ids: list[Any], rows: int) -> bool:
    """Every id an int in [0, rows)."""
    return all(type(b) is int for b in ids) and (not ids or (min(ids) >= 0 and max(ids) < rows))


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class PullJob:
    req_id: str  # this engine's id, reported back to the scheduler
    remote_req_id: str
    remote_engine_id: str
    host: str
    port: int
    first: int  # first kernel block of the request to fetch
    kblocks: list[int]  # where they go here, in order
    block_ids: list[int]  # scheduler blocks to report on failure
    # Differing TP (connector/heads.py): prefill's heads [a, b) into ours; None: whole blocks.
    heads: Heads | None = None
    local_heads: Heads | None = None
    reader: int = 0  # our index among the decode ranks pulling from this prefill rank
    readers: int = 1
    wait_s: float | None = None  # sent before prefill finished: prefill may take this long

    def __post_init__(self) -> None:
        h, lh = self.heads, self.local_heads
        if (h is None) != (lh is None) or (h and lh and h[1] - h[0] != lh[1] - lh[0]):
            raise ValueError(f"pull of {self.req_id}: prefill heads {h} do not match ours {lh}")

    @property
    def whole(self) -> bool:
        return self.heads is None


@dataclass
class _Conn:
    sock: socket.socket
    remote: ipc.Remote | None = None  # prefill's KV opened through CUDA IPC; None: bytes over TCP


class KVClient:
    """Decode side: pulls requests' KV into local blocks; pools idle connections per peer."""

    def __init__(self, kv: PagedKV, stager: Stager | None, cfg: PdbenchConfig, done: Completions) -> None:
        self.kv, self.stager, self.cfg, self.done = kv, stager, cfg, done
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._sig = kv.signature()
        self._ipc = cfg.ipc and stager is not None and stager.cuda
        self._remotes: dict[str, ipc.Remote | None] = {}  # by prefill token; None: failed to open
        self._tokens: dict[tuple[str, int], str] = {}  # the latest token of each peer
        self._told: set[tuple[str, int]] = set()  # peers whose TCP fallback was logged

    async def _connect(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            tune(
                sock,
                self.cfg.keepalive_idle_s,
                self.cfg.keepalive_interval_s,
                self.cfg.keepalive_count,
                self.cfg.sock_buf_bytes,
            )
            await asyncio.wait_for(loop.sock_connect(sock, addr), self.cfg.connect_timeout_s)
            await client_handshake(sock, self.cfg.secret or b"", self.cfg.io_timeout_s)
            remote = await self._hello(sock, (host, port)) if self._ipc and ipc.boot_id() else None
        except BaseException:
            sock.close()
            raise
        return _Conn(sock, remote)

    async def _hello(self, sock: socket.socket, peer: tuple[str, int]) -> ipc.Remote | None:
        """Once per connection: prefill's CUDA IPC handles, opened here, if it is on this host."""
        await send_frame(sock, {"op": "ipc_hello", "boot_id": ipc.boot_id()}, self.cfg.io_timeout_s)
        info = await recv_frame(sock, self.cfg.io_timeout_s)
        if not info.get("ok"):
            self._tell(peer, str(info.get("error")))
            return None
        token = str(info.get("token"))
        if token not in self._remotes:
            old = self._tokens.get(peer)
            if old is not None and old != token:
                self._remotes.pop(old, None)  # that prefill restarted: close its handles
            self._tokens[peer] = token
            try:
                remote = ipc.open_remote(info, self.kv)
                assert self.stager is not None
                remote.plan = self.stager.plan(remote.layers)
                self._remotes[token] = remote
                log.info("pdbench: pulls from %s:%d go GPU to GPU (CUDA IPC)", *peer)
            except ipc.IpcError as exc:
                self._remotes[token] = None
                self._tell(peer, str(exc))
        return self._remotes[token]

    def _tell(self, peer: tuple[str, int], why: str) -> None:
        if peer not in self._told:
            self._told.add(peer)
            log.info("pdbench: pulls from %s:%d use TCP: %s", *peer, why)

    async def _get(self, host: str, port: int) -> tuple[_Conn, bool]:
        idle = self._idle.get((host, port))
        if idle:
            return idle.pop(), True
        return await self._connect(host, port), False

    def _put(self, host: str, port: int, conn: _Conn) -> None:
        idle = self._idle.setdefault((host, port), [])
        if len(idle) < 8:
            idle.append(conn)
        else:
            conn.sock.close()

    async def pull(self, job: PullJob) -> bool:
        """Never raises: the outcome goes to `Completions` (failures with their blocks)."""
        return await self.pull_all([job])

    async def pull_all(self, jobs: list[PullJob]) -> bool:
        """The pulls of one request from several prefill ranks (differing TP), side by side;
        reported once, received only if every one succeeded."""
        got: list[PullTiming | None] = []
        try:
            got = list(await asyncio.gather(*(self._attempt(j) for j in jobs)))
        finally:
            timings = [t for t in got if t is not None]
            ok = bool(got) and len(timings) == len(got)
            self.done.received(jobs[0].req_id, ok, jobs[0].block_ids, timings)
        return ok

    async def _attempt(self, job: PullJob) -> PullTiming | None:
        """The pull's timing, or None when it failed (logged and counted)."""
        try:
            return await self._pull(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error(
                "pdbench: KV pull of %s from %s:%d failed: %s",
                job.req_id,
                job.host,
                job.port,
                f"{type(exc).__name__}: {exc}",
            )
            self.done.record(lambda s: setattr(s, "failed_recv", s.failed_recv + 1))
            return None

    def _pull_msg(self, job: PullJob, remote: ipc.Remote | None) -> dict[str, Any]:
        msg = {
            "op": "pull",
            "req": job.remote_req_id,
            "engine": job.remote_engine_id,
            "first": job.first,
            "count": len(job.kblocks),
            "layout": self._sig,
        }
        if job.heads is not None:
            msg["heads"] = list(job.heads)
        if job.readers != 1:
            msg.update(reader=job.reader, readers=job.readers)
        if job.wait_s is not None:
            msg["wait_s"] = job.wait_s
        if remote is not None:
            msg.update(path="ipc", token=remote.token)
        return msg

    async def _request(self, job: PullJob) -> tuple[_Conn, dict[str, Any]]:
        cfg = self.cfg
        for attempt in range(2):
            conn, reused = await self._get(job.host, job.port)
            try:
                remote = conn.remote if job.whole else None  # CUDA IPC moves whole blocks
                await send_frame(conn.sock, self._pull_msg(job, remote), cfg.io_timeout_s)
                first_answer = (job.wait_s or cfg.register_timeout_s) + cfg.io_timeout_s
                return conn, await recv_frame(conn.sock, first_answer)
            except (PeerError, OSError) as exc:
                conn.sock.close()
                if reused and attempt == 0:
                    continue  # a pooled connection went stale (prefill restarted): redial once
                raise TransferError(f"no response: {exc}") from exc
            except BaseException:
                conn.sock.close()
                raise
        raise AssertionError("unreachable")

    async def _pull(self, job: PullJob) -> PullTiming:
        cfg = self.cfg
        t0 = time.perf_counter()
        conn, resp = await self._request(job)
        if not resp.get("ok"):
            self._put(job.host, job.port, conn)
            raise TransferError(str(resp.get("error")))
        t1 = time.perf_counter()
        got = 0
        via_ipc = conn.remote is not None and job.whole
        try:
            if via_ipc:
                assert conn.remote is not None
                got = await self._copy_ipc(conn.remote, resp.get("blocks"), job)
            else:
                sink = _sink(self.kv, self.stager, job.kblocks, cfg, job.local_heads)
                async with contextlib.aclosing(sink) as views:  # type: ignore[type-var]  # an async generator
                    async for batch in views:
                        got += await recv_views(conn.sock, batch, cfg.io_timeout_s)
                        if cfg.debug_chunk_delay_s:
                            await asyncio.sleep(cfg.debug_chunk_delay_s)
            await send_frame(conn.sock, {"op": "ack", "req": job.remote_req_id}, cfg.io_timeout_s)
            t2 = time.perf_counter()
        except BaseException:
            conn.sock.close()
            raise
        self._put(job.host, job.port, conn)
        # Transfer time is the whole pull (request .. ack), the wait its share up to prefill's answer.
        self.done.record(
            lambda s: (
                s.recv_bytes.append(got),
                s.recv_s.append(t2 - t0),
                s.recv_wait_s.append(t1 - t0),
                s.count_path("recv", via_ipc),
            )
        )
        return PullTiming(got, t2 - t0, t1 - t0, via_ipc)

    async def _copy_ipc(self, remote: ipc.Remote, blocks: Any, job: PullJob) -> int:
        """Prefill's blocks straight into ours; returns once they landed (then we may ack)."""
        assert self.stager is not None
        rows = remote.layers[0].shape[0]
        # Bounds only: the kernel reads wherever the ids point, so none may leave prefill's cache.
        if not (isinstance(blocks, list) and len(blocks) == len(job.kblocks)) or not _within(blocks, rows):
            raise TransferError("prefill's block list does not match the pull")
        cfg = self.cfg
        return await self.stager.copy_from(remote.plan, blocks, job.kblocks, cfg.debug_corrupt, cfg.debug_chunk_delay_s)

    async def release(self, host: str, port: int, engine_id: str, remote_req_id: str) -> None:
        """Best effort: tell prefill to free a request we will not pull (its lease is the backstop)."""
        try:
            conn, _ = await self._get(host, port)
            msg = {"op": "release", "req": remote_req_id, "engine": engine_id}
            await send_frame(conn.sock, msg, self.cfg.io_timeout_s)
            self._put(host, port, conn)
        except Exception as exc:
            log.warning("pdbench: release of %s at %s:%d failed: %s", remote_req_id, host, port, exc)

    def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.sock.close()
        self._idle.clear()
        self._remotes.clear()
