"""pdbench connector transfer bandwidth against raw loopback TCP, measured in the same run.

Two processes on two cores (sender on core 0, receiver on core 1, as the local
recipe pins prefill and decode). For each request size:

* raw TCP, the ceiling: the receiver asks for N bytes, the sender sends them from one
  buffer, the receiver receives them into one buffer; time = request sent .. last byte (the
  best plain Python sockets do). A ceiling must be configured at least as well as what it bounds:
  it runs on one connection per socket-buffer setting (kernel autotuning, 1 MiB, 4 MiB, the
  connector's own `sock_buf_bytes`, 32 MiB; settings the kernel caps to the same buffer are
  run once) and I/O style (blocking `sendall`/`recv_into`, and non-blocking calls that wait
  for readiness as the connector's do: ~30 % faster on loopback here), and the best
  setting's median is the ceiling;
* connector: a real KVServer holding paged KV and a KVClient pulling it into its own
  blocks (different ids, none adjacent) over the same loopback; time = pull request
  sent .. ack sent (lookup, header, every layer, ack), the whole transfer.

Each repetition runs every raw setting and one pull, in an order rotated from one repetition
to the next, so that load from other processes on the machine hits all alike; medians and
interquartile ranges are printed, with the load average.

Layouts: `tiny` (the local recipe's tiny Llama on CPU: 2 layers, 4 KV heads, 128-token
blocks, fp32) and `28L` (28 layers, 4 KV heads x 128 dims, 16-token blocks, bf16).

    .venv/bin/python benchmarks/bench_connector_transfer.py [--layout tiny,28L] \\
        [--tokens 1024,2048,8192] [--reps 30] [--json out.json]

Goal (exit 0 only when met): pull / raw-TCP ceiling >= 0.70 (GB/s, 1e9 bytes) at every
layout and size.

Other benchmarks take the ceiling from here: `raw_tcp(port, sizes, reps)` (median seconds
of the best setting per size) or `raw_tcp_ceiling(...)` (with the setting and the spread).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import select
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import conditions_text, rotated
from connector.config import PdbenchConfig  # torch-free

GOAL = 0.70  # pull GB/s / raw-TCP ceiling GB/s, at every layout and size
LAYOUTS: dict[str, dict[str, Any]] = {
    "tiny": {"layers": 2, "heads": 4, "bs": 128, "c": 128, "dtype": "float32"},
    "28L": {"layers": 28, "heads": 4, "bs": 16, "c": 256, "dtype": "bfloat16"},
}
# SO_SNDBUF/SO_RCVBUF settings the raw ceiling tries (0: the kernel's autotuning); the
# connector's own setting is always among them.
RAW_BUFS = tuple(dict.fromkeys((0, 1 << 20, 4 << 20, PdbenchConfig().sock_buf_bytes, 32 << 20)))
WARMUP = 2  # repetitions left out of the medians
IO_TIMEOUT_S = 60.0  # a raw transfer that makes no progress this long fails the run


def _pin(core: int) -> None:
    if core < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {core})


def _caches(layout: dict[str, Any], n_blocks: int, fill: bool) -> dict[str, Any]:
    import torch

    dt = getattr(torch, layout["dtype"])
    shape = (n_blocks, layout["heads"], layout["bs"], layout["c"])
    return {
        f"l{i}": (torch.randn(shape).to(dt) if fill else torch.zeros(shape, dtype=dt)) for i in range(layout["layers"])
    }


def kv_bytes(layout: dict[str, Any], tokens: int) -> int:
    blocks = -(-tokens // layout["bs"])
    el = 4 if layout["dtype"] == "float32" else 2
    return blocks * layout["layers"] * layout["heads"] * layout["bs"] * layout["c"] * el


def _set_bufs(sock: socket.socket, buf: int) -> None:
    if buf:  # as connector.protocol.tune: fixed buffers, no autotuning
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buf)


# -- the sending process: raw TCP and the connector's KV server side by side -------


def _wait(sock: socket.socket, event: int) -> None:
    """Until `sock` is ready for `event` (select.POLLIN / POLLOUT); bounded, as every wait here."""
    poller = select.poll()
    poller.register(sock, event)
    if not poller.poll(IO_TIMEOUT_S * 1000):
        raise TimeoutError(f"raw TCP: no progress in {IO_TIMEOUT_S:g} s")


def _send_nonblocking(conn: socket.socket, view: memoryview) -> None:
    """As the connector sends: non-blocking writes, waiting for readiness when the buffer is full."""
    off = 0
    while off < len(view):
        try:
            off += conn.send(view[off:])
        except BlockingIOError:
            _wait(conn, select.POLLOUT)


def _raw_conn(conn: socket.socket, data: memoryview) -> None:
    """One raw connection: its first 9 bytes are its buffer setting and I/O style, then each
    8-byte size request is answered with that many bytes from one buffer."""
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = conn.recv(9, socket.MSG_WAITALL)
        if len(head) < 9:
            return
        _set_bufs(conn, int.from_bytes(head[:8], "big"))
        blocking = head[8:] == b"b"
        while True:
            head = conn.recv(8, socket.MSG_WAITALL)
            if len(head) < 8:
                return
            view = data[: int.from_bytes(head, "big")]
            if blocking:
                conn.sendall(view)
            else:
                conn.setblocking(False)
                _send_nonblocking(conn, view)
                conn.setblocking(True)


def _raw_serve(ls: socket.socket, max_bytes: int) -> None:
    data = memoryview(bytearray(os.urandom(1 << 16)) * (-(-max_bytes >> 16)))
    while True:
        conn, _ = ls.accept()
        threading.Thread(target=_raw_conn, args=(conn, data), daemon=True).start()


def _sender(
    port: int,
    max_bytes: int,
    layout: dict[str, Any] | None,
    n_blocks: int,
    reqs: list[tuple[str, list[int]]],
    ready: Any,
    stop: Any,
) -> None:
    _pin(0)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(16)
    threading.Thread(target=_raw_serve, args=(ls, max_bytes), daemon=True).start()
    io = None
    if layout is not None:
        from connector.layout import PagedKV
        from connector.transport import Completions, IOLoop, KVServer

        kv = PagedKV(_caches(layout, n_blocks, True), n_blocks, layout["bs"])
        io = IOLoop("bench-server")
        srv = KVServer(kv, None, PdbenchConfig(port=port + 1, lease_s=3600), "P", port + 1, Completions())
        io.submit(srv.start()).result(10)
        for rid, blocks in reqs:
            io.call(srv.register, rid, blocks)
    ready.set()
    stop.wait(3600)
    if io is not None:
        io.stop()


class RawConn:
    """One raw TCP connection to the sender with the given socket buffers (0: autotuning), both
    ends blocking or both non-blocking (readiness-driven, as the connector's I/O)."""

    def __init__(self, port: int, buf: int, blocking: bool, into: memoryview) -> None:
        self.into, self.blocking = into, blocking
        self.settings = [buf]  # and those the kernel made the same buffer (see Sender)
        self.sock = socket.socket()
        _set_bufs(self.sock, buf)  # before connecting: the receive window's scale is fixed then
        self.sock.settimeout(IO_TIMEOUT_S)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(buf.to_bytes(8, "big") + (b"b" if blocking else b"n"))
        rcv = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        snd = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        # What the kernel made of the setting (it doubles and caps it): equal ones run once.
        self.effective = ((rcv, snd) if buf else ("auto",), blocking)
        self.rcv = rcv
        if not blocking:
            self.sock.setblocking(False)

    @property
    def label(self) -> str:
        style = "blocking" if self.blocking else "non-blocking"
        if self.settings == [0]:
            return f"autotuning, {style}"
        mib = " = ".join(f"{b / 2**20:g}" for b in self.settings)
        return f"{mib} MiB (kernel rcvbuf {self.rcv >> 10} KiB), {style}"

    def raw(self, size: int) -> float:
        """Seconds from asking for `size` bytes to holding the last one."""
        t0 = time.perf_counter()
        if self.blocking:
            self.sock.sendall(size.to_bytes(8, "big"))
        else:
            _send_nonblocking(self.sock, memoryview(size.to_bytes(8, "big")))
        got = 0
        while got < size:
            try:
                k = self.sock.recv_into(self.into[got:size])
            except BlockingIOError:
                _wait(self.sock, select.POLLIN)
                continue
            if not k:
                raise ConnectionError("raw TCP sender closed the connection")
            got += k
        return time.perf_counter() - t0

    def close(self) -> None:
        self.sock.close()


class Sender:
    """The sending process (core 0): raw TCP on `port`, the KV server on `port + 1`."""

    def __init__(
        self,
        port: int,
        max_bytes: int,
        layout: dict[str, Any] | None = None,
        n_blocks: int = 0,
        reqs: list[tuple[str, list[int]]] | None = None,
        bufs: tuple[int, ...] = RAW_BUFS,
    ) -> None:
        ctx = mp.get_context("spawn")
        self.ready, self.stop = ctx.Event(), ctx.Event()
        self.proc = ctx.Process(
            target=_sender, args=(port, max_bytes, layout, n_blocks, reqs or [], self.ready, self.stop), daemon=True
        )
        self.proc.start()
        self.conns: list[RawConn] = []
        try:
            if not self.ready.wait(120):
                raise RuntimeError("sender did not start")
            into = memoryview(bytearray(max_bytes))
            seen: dict[tuple[Any, ...], RawConn] = {}
            for buf, blocking in ((b, x) for x in (True, False) for b in bufs):
                c = RawConn(port, buf, blocking, into)
                if c.effective in seen:
                    seen[c.effective].settings.append(buf)
                    c.close()
                else:
                    seen[c.effective] = c
                    self.conns.append(c)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.stop.set()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


@dataclass
class Ceiling:
    """The raw-TCP ceiling of one size: the best buffer setting's median and its spread."""

    seconds: float  # median of the best setting
    setting: str  # which one
    q1: float  # its interquartile range (s)
    q3: float
    by_setting: dict[str, float]  # every setting's median (s)

    def gbps(self, size: int) -> float:
        return size / self.seconds / 1e9


def _quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def _ceiling(times: dict[str, list[float]]) -> Ceiling:
    medians = {k: statistics.median(v) for k, v in times.items()}
    best = min(medians, key=lambda k: medians[k])
    q1, q3 = _quartiles(times[best])
    return Ceiling(medians[best], best, q1, q3, medians)


def raw_tcp_ceiling(port: int, sizes: list[int], reps: int, bufs: tuple[int, ...] = RAW_BUFS) -> dict[int, Ceiling]:
    """The raw loopback TCP ceiling per size (sender on core 0, this process on core 1): every
    buffer setting in `bufs` (those the kernel makes equal run once), rotated per repetition,
    `reps` repetitions after WARMUP; the best setting's median is the ceiling."""
    if not sizes:
        return {}
    saved = os.sched_getaffinity(0)
    snd = Sender(port, max(sizes), bufs=bufs)
    _pin(1)
    try:
        out = {}
        for size in sizes:
            times: dict[str, list[float]] = {c.label: [] for c in snd.conns}
            for i in range(reps + WARMUP):
                for c in rotated(snd.conns, i):
                    t = c.raw(size)
                    if i >= WARMUP:
                        times[c.label].append(t)
            out[size] = _ceiling(times)
        return out
    finally:
        snd.close()
        os.sched_setaffinity(0, saved)


def raw_tcp(port: int, sizes: list[int], reps: int) -> dict[int, float]:
    """Median seconds per `size`-byte message over raw loopback TCP at its best buffer setting."""
    return {size: c.seconds for size, c in raw_tcp_ceiling(port, sizes, reps).items()}


def measure(port: int, layout: dict[str, Any], tokens: list[int], reps: int) -> dict[int, dict[str, Any]]:
    """Raw TCP (every buffer setting) and connector pulls of the same sizes, interleaved so that
    load drift hits all alike."""
    from connector.layout import PagedKV
    from connector.transport import Completions, IOLoop, KVClient, PullJob

    need = {t: -(-t // layout["bs"]) for t in tokens}
    n_blocks = max(need.values()) * 2 + 8
    # Prefill holds blocks 0..n; decode writes into the other half in reverse order
    # (its ids differ and no two are adjacent: the receiving side gets no merged runs).
    reqs = [(f"r{t}-{i}", list(range(need[t]))) for t in tokens for i in range(reps + WARMUP)]
    saved = os.sched_getaffinity(0)
    snd = Sender(port, max(kv_bytes(layout, t) for t in tokens), layout, n_blocks, reqs)
    _pin(1)
    kv = PagedKV(_caches(layout, n_blocks, False), n_blocks, layout["bs"])
    done = Completions()
    io = IOLoop("bench-client")
    client = KVClient(kv, None, PdbenchConfig(), done)
    out: dict[int, dict[str, Any]] = {}
    try:
        for t in tokens:
            size = kv_bytes(layout, t)
            dst = list(range(n_blocks - 1, n_blocks - 1 - need[t], -1))
            raws: dict[str, list[float]] = {c.label: [] for c in snd.conns}
            walls: list[float] = []
            for i in range(reps + WARMUP):
                for who in rotated([*snd.conns, None], i):
                    if who is not None:
                        x = who.raw(size)
                        if i >= WARMUP:
                            raws[who.label].append(x)
                        continue
                    job = PullJob(f"d{t}-{i}", f"r{t}-{i}", "P", "127.0.0.1", port + 1, 0, dst, dst)
                    t0 = time.perf_counter()
                    ok = io.submit(client.pull(job)).result(60)
                    wall = time.perf_counter() - t0
                    if not ok or done.drain_stats() is None:
                        raise RuntimeError(f"pull of {t} tokens failed")
                    if i >= WARMUP:
                        walls.append(wall)
            q1, q3 = _quartiles(walls)
            out[t] = {"ceiling": _ceiling(raws), "pull_s": statistics.median(walls), "pull_q1": q1, "pull_q3": q3}
    finally:
        io.stop()
        snd.close()
        os.sched_setaffinity(0, saved)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", default="tiny,28L")
    ap.add_argument("--tokens", default="1024,2048,8192")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--port", type=int, default=15680)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.reps < 3:
        ap.error("--reps must be >= 3 (medians and quartiles of the interleaved repetitions)")
    unknown = sorted(set(a.layout.split(",")) - set(LAYOUTS))
    if unknown:
        ap.error(f"--layout: unknown {unknown}; choose from {sorted(LAYOUTS)}")
    tokens = [int(x) for x in a.tokens.split(",")]
    before = conditions_text()
    rows = []
    for name in a.layout.split(","):
        layout = LAYOUTS[name]
        res = measure(a.port, layout, tokens, a.reps)
        for t in tokens:
            size, c = kv_bytes(layout, t), res[t]["ceiling"]
            r: dict[str, Any] = {
                "layout": name,
                "tokens": t,
                "bytes": size,
                "raw_gbps": c.gbps(size),
                "raw_gbps_iqr": [size / c.q3 / 1e9, size / c.q1 / 1e9],
                "raw_setting": c.setting,
                "raw_gbps_by_setting": {k: size / s / 1e9 for k, s in c.by_setting.items()},
                "pull_gbps": size / res[t]["pull_s"] / 1e9,
                "pull_gbps_iqr": [size / res[t]["pull_q3"] / 1e9, size / res[t]["pull_q1"] / 1e9],
            }
            r["ratio"] = r["pull_gbps"] / r["raw_gbps"]
            r["pass"] = r["ratio"] >= GOAL
            rows.append(r)
    after = conditions_text()
    print(
        f"\nconditions: sender on core 0, receiver on core 1, loopback, {a.reps} interleaved repetitions after "
        f"{WARMUP} warm-ups (order rotated each repetition), medians [interquartile range]; "
        f"start {before}; end {after}"
    )
    print(
        f"{'layout':6} {'tokens':>6} {'MB':>8} {'raw TCP ceiling GB/s':>24} {'best setting':>40} "
        f"{'pull GB/s':>20} {'pull/raw':>9}  goal >= {GOAL:.2f}"
    )
    for r in rows:
        rq, pq = r["raw_gbps_iqr"], r["pull_gbps_iqr"]
        print(
            f"{r['layout']:6} {r['tokens']:>6} {r['bytes'] / 1e6:>8.2f} "
            f"{r['raw_gbps']:>6.2f} [{rq[0]:5.2f}-{rq[1]:5.2f}]{'':>7} {r['raw_setting']:>40} "
            f"{r['pull_gbps']:>6.2f} [{pq[0]:5.2f}-{pq[1]:5.2f}] {r['ratio']:>9.2f}  {'PASS' if r['pass'] else 'FAIL'}"
        )
        others = ", ".join(f"{k} {v:.2f}" for k, v in r["raw_gbps_by_setting"].items())
        print(f"{'':22} raw TCP by socket-buffer setting (GB/s): {others}")
    print(
        "raw = size request .. last byte, best of the socket-buffer settings and I/O styles; pull = pull request .. ack "
        f"(whole transfer, the connector's sock_buf_bytes {PdbenchConfig().sock_buf_bytes >> 20} MiB); "
        "GB/s = 1e9 B/s"
    )
    met = all(r["pass"] for r in rows)
    print(f"goal pull / raw TCP ceiling >= {GOAL:.2f} at every layout and size: {'PASS' if met else 'FAIL'}")
    if a.json:
        a.json.write_text(json.dumps({"conditions": [before, after], "goal": GOAL, "met": met, "rows": rows}, indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
