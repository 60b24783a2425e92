"""pdbench connector transfer bandwidth against raw loopback TCP, measured in the same run.

Two processes on two cores (sender on core 0, receiver on core 1, as the local
recipe pins prefill and decode). For each request size:

* raw TCP: the receiver asks for N bytes, the sender `sendall`s them from one
  buffer, the receiver `recv_into`s one buffer; time = request sent .. last byte
  (the best plain Python sockets do);
* connector: a real KVServer holding paged KV and a KVClient pulling it into its own
  blocks (different ids, none adjacent) over the same loopback; time = pull request
  sent .. ack sent (lookup, header, every layer, ack), the whole transfer.

Raw and connector transfers alternate, request by request, so that load from other
processes on the machine hits both alike; medians are reported.

Layouts: `tiny` (the local recipe's tiny Llama on CPU: 2 layers, 4 KV heads, 128-token
blocks, fp32) and `28L` (28 layers, 4 KV heads x 128 dims, 16-token blocks, bf16).

    .venv/bin/python benchmarks/bench_connector_transfer.py [--layout tiny,28L] \\
        [--tokens 1024,2048,8192] [--reps 30] [--json out.json]

Prints bandwidths (GB/s, 1e9 bytes) and the ratio connector / raw (goal >= 0.70).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYOUTS: dict[str, dict[str, Any]] = {
    "tiny": {"layers": 2, "heads": 4, "bs": 128, "c": 128, "dtype": "float32"},
    "28L": {"layers": 28, "heads": 4, "bs": 16, "c": 256, "dtype": "bfloat16"},
}


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


# -- the sending process: raw TCP and the connector's KV server side by side -------


def _raw_serve(port: int, ready: Any) -> None:
    """Raw TCP sender: for each 8-byte size request, sendall that many bytes from one buffer."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4)
    ready.set()
    data = memoryview(bytearray(os.urandom(1 << 16)) * (1 << 14))  # 1 GiB
    while True:
        conn, _ = ls.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            head = conn.recv(8)
            if len(head) < 8:
                break
            conn.sendall(data[: int.from_bytes(head, "big")])
        conn.close()


def _sender(
    port: int, layout: dict[str, Any] | None, n_blocks: int, reqs: list[tuple[str, list[int]]], ready: Any, stop: Any
) -> None:
    _pin(0)
    import threading

    raw_ready = threading.Event()
    threading.Thread(target=_raw_serve, args=(port, raw_ready), daemon=True).start()
    raw_ready.wait(10)
    io = None
    if layout is not None:
        from connector.config import PdbenchConfig
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


class Sender:
    """The sending process (core 0): raw TCP on `port`, the KV server on `port + 1`."""

    def __init__(
        self,
        port: int,
        layout: dict[str, Any] | None = None,
        n_blocks: int = 0,
        reqs: list[tuple[str, list[int]]] | None = None,
    ) -> None:
        ctx = mp.get_context("spawn")
        self.ready, self.stop = ctx.Event(), ctx.Event()
        self.proc = ctx.Process(
            target=_sender, args=(port, layout, n_blocks, reqs or [], self.ready, self.stop), daemon=True
        )
        self.proc.start()
        if not self.ready.wait(120):
            raise RuntimeError("sender did not start")
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = memoryview(bytearray(1 << 30))

    def raw(self, size: int) -> float:
        """Seconds from asking for `size` bytes to holding the last one (blocking recv_into)."""
        t0 = time.perf_counter()
        self.sock.sendall(size.to_bytes(8, "big"))
        got = 0
        while got < size:
            got += self.sock.recv_into(self.buf[got:size])
        return time.perf_counter() - t0

    def close(self) -> None:
        self.sock.close()
        self.stop.set()
        self.proc.join(10)


def raw_tcp(port: int, sizes: list[int], reps: int) -> dict[int, float]:
    """Median seconds per `size`-byte message over raw loopback TCP (sender on core 0, us on core 1)."""
    saved = os.sched_getaffinity(0)
    snd = Sender(port)
    _pin(1)
    try:
        out = {}
        for size in sizes:
            times = [snd.raw(size) for _ in range(reps + 2)][2:]
            out[size] = statistics.median(times)
        return out
    finally:
        snd.close()
        os.sched_setaffinity(0, saved)


def measure(port: int, layout: dict[str, Any], tokens: list[int], reps: int) -> dict[int, dict[str, float]]:
    """Raw TCP and connector pulls of the same sizes, interleaved so that load drift hits both."""
    from connector.config import PdbenchConfig
    from connector.layout import PagedKV
    from connector.transport import Completions, IOLoop, KVClient, PullJob

    need = {t: -(-t // layout["bs"]) for t in tokens}
    n_blocks = max(need.values()) * 2 + 8
    # Prefill holds blocks 0..n; decode writes into the other half in reverse order
    # (its ids differ and no two are adjacent: the receiving side gets no merged runs).
    reqs = [(f"r{t}-{i}", list(range(need[t]))) for t in tokens for i in range(reps + 2)]
    saved = os.sched_getaffinity(0)
    snd = Sender(port, layout, n_blocks, reqs)
    _pin(1)
    kv = PagedKV(_caches(layout, n_blocks, False), n_blocks, layout["bs"])
    done = Completions()
    io = IOLoop("bench-client")
    client = KVClient(kv, None, PdbenchConfig(), done)
    out: dict[int, dict[str, float]] = {}
    try:
        for t in tokens:
            size = kv_bytes(layout, t)
            dst = list(range(n_blocks - 1, n_blocks - 1 - need[t], -1))
            raws, walls = [], []
            for i in range(reps + 2):
                raw = snd.raw(size)
                job = PullJob(f"d{t}-{i}", f"r{t}-{i}", "P", "127.0.0.1", port + 1, 0, dst, dst)
                t0 = time.perf_counter()
                ok = io.submit(client.pull(job)).result(60)
                wall = time.perf_counter() - t0
                assert ok and done.drain_stats() is not None, "pull failed"
                if i >= 2:  # warm-up
                    raws.append(raw)
                    walls.append(wall)
            out[t] = {"raw_s": statistics.median(raws), "pull_s": statistics.median(walls)}
    finally:
        io.stop()
        snd.close()
        os.sched_setaffinity(0, saved)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", default="tiny,28L")
    ap.add_argument("--tokens", default="1024,2048,8192")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--port", type=int, default=15680)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    tokens = [int(x) for x in a.tokens.split(",")]
    rows = []
    for name in a.layout.split(","):
        layout = LAYOUTS[name]
        res = measure(a.port, layout, tokens, a.reps)
        for t in tokens:
            size = kv_bytes(layout, t)
            r = {
                "layout": name,
                "tokens": t,
                "bytes": size,
                "raw_gbps": size / res[t]["raw_s"] / 1e9,
                "pull_gbps": size / res[t]["pull_s"] / 1e9,
            }
            r["ratio"] = r["pull_gbps"] / r["raw_gbps"]
            rows.append(r)
    print(f"{'layout':6} {'tokens':>6} {'MB':>8} {'raw TCP':>9} {'pull':>9} {'pull/raw':>9}")
    for r in rows:
        print(
            f"{r['layout']:6} {r['tokens']:>6} {r['bytes'] / 1e6:>8.2f} {r['raw_gbps']:>8.2f}G "
            f"{r['pull_gbps']:>8.2f}G {r['ratio']:>9.2f}"
        )
    print("raw = size request .. last byte; pull = pull request .. ack (whole transfer); GB/s = 1e9 B/s")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
