"""Wire format and non-blocking socket helpers for the KV transfer (asyncio, no polling).

A control frame is a 4-byte big-endian length and a JSON object. Every connection
starts with the job-secret handshake of connector/auth.py; then a pull is:

    decode -> prefill  {"op": "pull", "req", "engine", "first", "count", "layout"}
    prefill -> decode  {"ok": true, "layer_bytes"} | {"ok": false, "error"}
    prefill -> decode  one raw payload per layer: `count` blocks, each in C order
    decode -> prefill  {"op": "ack", "req"}     (decode is done with prefill's blocks)

and `{"op": "release", "req", "engine"}` frees a request decode will never pull.

Same host, CUDA caches (connector/ipc.py): once per connection decode sends
`{"op": "ipc_hello", "boot_id"}`; prefill answers `{"ok": false, "error"}` or
`{"ok": true, "boot_id", "token", "uuid", "dtype", "storages", "layers"}` (CUDA IPC
handle fields as hex). A pull then adds `"path": "ipc", "token"`; prefill's ok carries
`"blocks"` (its kernel block ids) and no payload follows: decode copies GPU to GPU,
then acks as above.
Block indices ("first", "count") are in kernel blocks of the request's own block
list, so the two sides' block ids and block counts are independent.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

MAX_FRAME = 1 << 20
_LEN = struct.Struct(">I")


class PeerError(Exception):
    """The peer closed, timed out, or broke the protocol."""


def tune(sock: socket.socket, idle: int, interval: int, count: int, buf_bytes: int = 0) -> None:
    sock.setblocking(False)
    if buf_bytes:  # fixed buffers (no autotuning): fewer wakeups per transfer
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buf_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buf_bytes)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


async def recv_into(sock: socket.socket, view: memoryview, timeout: float | None) -> None:
    """Fill `view` completely; `timeout` bounds each period without progress (None: none)."""
    loop = asyncio.get_running_loop()
    got, n = 0, len(view)
    async with asyncio.timeout(timeout) as cm:
        while got < n:
            k = await loop.sock_recv_into(sock, view[got:])
            if k == 0:
                raise PeerError("connection closed by peer")
            got += k
            if timeout is not None:
                cm.reschedule(loop.time() + timeout)


# Vectored I/O: one syscall moves many blocks (sendmsg/recvmsg_into), so scattered
# blocks cost no per-block await. asyncio has no vectored socket calls: we try the
# call and, when it would block, wait for readiness with add_reader/add_writer.
IOV_MAX = 512


async def _ready(sock: socket.socket, write: bool) -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    fd = sock.fileno()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    add(fd, ready)
    try:
        await fut
    finally:
        remove(fd)


async def _vector_io(sock: socket.socket, views: list[memoryview], timeout: float, write: bool) -> int:
    """Move every byte of `views` (in order); `timeout` bounds each period without progress."""
    loop = asyncio.get_running_loop()
    i, off, total = 0, 0, 0
    async with asyncio.timeout(timeout) as cm:
        while i < len(views):
            bufs = [views[i][off:], *views[i + 1 : i + IOV_MAX]]
            try:
                n = sock.sendmsg(bufs) if write else sock.recvmsg_into(bufs)[0]
            except (BlockingIOError, InterruptedError):
                await _ready(sock, write)
                continue
            if n == 0 and not write:
                raise PeerError("connection closed by peer")
            total += n
            cm.reschedule(loop.time() + timeout)
            while n > 0:
                rest = len(views[i]) - off
                if n >= rest:
                    n -= rest
                    i, off = i + 1, 0
                else:
                    off, n = off + n, 0
            while i < len(views) and len(views[i]) == 0:
                i += 1
    return total


async def send_views(sock: socket.socket, views: list[memoryview], timeout: float) -> int:
    return await _vector_io(sock, views, timeout, write=True)


async def recv_views(sock: socket.socket, views: list[memoryview], timeout: float) -> int:
    return await _vector_io(sock, views, timeout, write=False)


async def send_all(sock: socket.socket, view: memoryview | bytes, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        await loop.sock_sendall(sock, view)


async def send_frame(sock: socket.socket, msg: dict[str, Any], timeout: float) -> None:
    body = json.dumps(msg, separators=(",", ":")).encode()
    await send_all(sock, _LEN.pack(len(body)) + body, timeout)


async def recv_frame(sock: socket.socket, timeout: float | None, limit: int = MAX_FRAME) -> dict[str, Any]:
    head = bytearray(4)
    await recv_into(sock, memoryview(head), timeout)
    (n,) = _LEN.unpack(head)
    if n > limit:
        raise PeerError(f"control frame of {n} bytes")
    body = bytearray(n)
    await recv_into(sock, memoryview(body), timeout)
    msg = json.loads(body)
    if not isinstance(msg, dict):
        raise PeerError("control frame is not an object")
    return msg
