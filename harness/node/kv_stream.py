"""A measured TCP transfer between two nodes of a job: the measured half of the KV ceiling across
hosts (harness.node.kv_ceiling builds the record; the line rate: harness.node.link_rate).

decode-0's node listens (`Sink`, on decode-0's node address, so the bytes arrive on the interface
the KV arrives on) and records where in state/kv_sink.json; node 0, which runs prefill-0, connects
and `send`s. The sender proves the job's secret (state/kv_secret) first, so nothing else's bytes
are counted, then announces its transfers (bytes each, how many); the sink reads each transfer
whole and answers one byte. Each transfer is timed from its first byte sent to that answer: the
bytes arrived, not merely left the sender's socket buffer (sglang #31877's over-line-rate figures
came from timing the send alone). The first transfer is untimed (TCP's slow start).
Every socket operation is bounded; the sink serves one measurement and ends.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import socket
import struct
import threading
import time
from pathlib import Path
from types import TracebackType

from harness import atomic

log = logging.getLogger(__name__)

MAGIC = b"pdbench-kv-stream-1\n"
HEADER = struct.Struct("!QI")  # bytes per transfer, transfers
DIGEST_BYTES = 32
CHUNK = 1 << 20
MAX_BYTES, MAX_TRANSFERS = 4 << 30, 64  # what a sink accepts: a bounded amount of work
IO_TIMEOUT_S = 30.0  # any one socket operation
ACCEPT_POLL_S = 0.2  # how often the sink's accept loop looks at its stop flag
ACK = b"\x01"


def secret_digest(secret_file: Path) -> bytes:
    """What the sender proves: sha256 of the job's secret (the secret itself never crosses)."""
    return hashlib.sha256(secret_file.read_bytes().strip()).digest()


def _recv_bytes(conn: socket.socket, n: int) -> bytes:
    """n bytes; ConnectionError when the peer closed first."""
    out = bytearray()
    while len(out) < n:
        got = conn.recv(n - len(out))
        if not got:
            raise ConnectionError(f"the peer closed after {len(out)} of {n} bytes")
        out += got
    return bytes(out)


def _recv_into(conn: socket.socket, n: int, buf: memoryview) -> None:
    """n bytes read through `buf` (overwritten: only their arrival counts)."""
    left = n
    while left:
        got = conn.recv_into(buf[: min(left, len(buf))])
        if not got:
            raise ConnectionError(f"the peer closed after {n - left} of {n} bytes")
        left -= got


class Sink:
    """The listening end, a thread of decode-0's node process: `with Sink(...)` listens and writes
    `record` ({"node", "addr", "port"}); leaving it stops the thread, joins it and removes the record.
    It serves connections one at a time until one proved the secret and finished."""

    def __init__(self, addr: str, node: int, digest: bytes, record: Path):
        self.addr, self.node, self.digest, self.record = addr, node, digest, record
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.served = threading.Event()  # one measurement was served whole
        self.refused: list[str] = []  # why each other connection was dropped
        self.received = 0  # bytes of transfers read whole

    def __enter__(self) -> Sink:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self.addr, 0))
            sock.listen(1)
            sock.settimeout(ACCEPT_POLL_S)
            atomic.write_json(self.record, {"node": self.node, "addr": self.addr, "port": sock.getsockname()[1]})
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="kv-stream-sink", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            # A connection in progress ends at its next socket timeout at the latest.
            self._thread.join(IO_TIMEOUT_S + ACCEPT_POLL_S + 1)
        if self._sock is not None:
            self._sock.close()
        self.record.unlink(missing_ok=True)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _serve(self) -> None:
        assert self._sock is not None
        with self._sock:  # closed once one measurement is served: nothing listens through the sweep
            while not self._stop.is_set() and not self.served.is_set():
                try:
                    conn, peer = self._sock.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return  # the socket was closed
                with conn:
                    try:
                        self._one(conn)
                        self.served.set()
                    except (OSError, ValueError) as e:  # socket.timeout is an OSError
                        self.refused.append(f"{peer[0]}: {e}")
                        log.warning("KV stream sink: dropped a connection from %s: %s", peer[0], e)

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(IO_TIMEOUT_S)
        hello = _recv_bytes(conn, len(MAGIC) + DIGEST_BYTES)
        if hello[: len(MAGIC)] != MAGIC or not hmac.compare_digest(hello[len(MAGIC) :], self.digest):
            raise ValueError("not this job's KV stream (no proof of the job's secret)")
        nbytes, transfers = HEADER.unpack(_recv_bytes(conn, HEADER.size))
        if not 0 < nbytes <= MAX_BYTES or not 0 < transfers <= MAX_TRANSFERS:
            raise ValueError(f"{transfers} transfer(s) of {nbytes} bytes: over this sink's bounds")
        buf = memoryview(bytearray(min(CHUNK, nbytes)))
        for _ in range(transfers):
            if self._stop.is_set():
                raise ValueError("the sink was stopped mid-measurement")
            _recv_into(conn, nbytes, buf)
            self.received += nbytes
            conn.sendall(ACK)


def send(addr: str, port: int, digest: bytes, nbytes: int, repeats: int, timeout: float) -> tuple[list[float], str]:
    """Sends 1 + `repeats` transfers of `nbytes` to the sink at addr:port; returns each timed
    transfer's seconds and this end's local address. Raises OSError (TimeoutError included) or
    ConnectionError when it cannot, or when the whole exchange passes `timeout` seconds."""
    deadline = time.monotonic() + timeout
    payload = memoryview(bytearray(b"\xa5") * min(CHUNK, nbytes))
    with socket.create_connection((addr, port), timeout=min(IO_TIMEOUT_S, timeout)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        local = s.getsockname()[0]
        s.sendall(MAGIC + digest + HEADER.pack(nbytes, repeats + 1))
        times = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            left = nbytes
            while left:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the transfers did not end within {timeout:g} s")
                n = min(left, len(payload))
                s.sendall(payload[:n])
                left -= n
            if s.recv(1) != ACK:
                raise ConnectionError("the sink closed before it acknowledged a transfer")
            if i:
                times.append(time.perf_counter() - t0)
    return times, local
