"""The connector's CUDA path: GPU -> pinned host -> TCP -> pinned host -> GPU, against its limits.

Needs torch with CUDA, not vLLM. Two processes share the GPU: a KVServer holding a
paged KV cache on the GPU and a KVClient pulling requests into its own GPU cache,
both through `connector.staging.Stager` (gather to a pinned ring on a copy stream,
D2H overlapped with sending; receive into pinned slots, H2D + scatter overlapped with
receiving). Layout: 28 layers, 16-token blocks, bf16, 4 KV heads x 128 dims, K and V
in separate halves of each layer (blocks are strided, as in vLLM's flash-attention
cache). The same run measures the limits: pinned D2H and H2D copy bandwidth and raw
loopback TCP between two processes. Received blocks are checked bit for bit.

    python3 benchmarks/bench_connector_cuda.py [--tokens 1024,4096,16384] [--reps 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LAYERS, BS, HEADS, DIM = 28, 16, 4, 128


def gpu_caches(n_blocks: int, seed: int | None) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cuda")
    out = {}
    for i in range(LAYERS):
        raw = torch.empty(2, n_blocks, BS, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
        if seed is not None:
            g.manual_seed(seed + i)
            raw.normal_(generator=g)
        else:
            raw.zero_()
        out[f"layers.{i}"] = raw.transpose(0, 1)  # [B, 2, N, H, D] view, blocks strided
    return out


def token_bytes() -> int:
    return LAYERS * 2 * HEADS * DIM * 2


def copy_limits(nbytes: int = 1 << 28) -> dict[str, float]:
    import torch

    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    out = {}
    for name, (dst, src) in {"d2h": (host, dev), "h2d": (dev, host)}.items():
        times = []
        for i in range(6):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src, non_blocking=True)
            e.record()
            e.synchronize()
            if i:
                times.append(s.elapsed_time(e) / 1e3)
        out[name] = nbytes / statistics.median(times) / 1e9
    return out


def _pin(cores: set[int]) -> None:
    import os

    os.sched_setaffinity(0, cores & os.sched_getaffinity(0) or os.sched_getaffinity(0))


def _server(
    port: int, n_blocks: int, reqs: list[tuple[str, list[int]]], chunk: int, depth: int, ready: Any, stop: Any
) -> None:
    _pin({2, 3})  # like a prefill worker: its own cores for model thread, IO and event waits
    from connector.config import PdbenchConfig
    from connector.layout import PagedKV
    from connector.staging import Stager
    from connector.transport import Completions, IOLoop, KVServer

    kv = PagedKV(gpu_caches(n_blocks, seed=1), n_blocks, BS)
    cfg = PdbenchConfig(port=port, lease_s=3600, chunk_bytes=chunk, pipeline_depth=depth)
    io = IOLoop("bench-server")
    srv = KVServer(kv, Stager(kv, chunk, depth), cfg, "P", port, Completions())
    io.submit(srv.start()).result(10)
    for rid, blocks in reqs:
        io.call(srv.register, rid, blocks)
    ready.set()
    stop.wait(3600)
    io.stop()


def pipeline(port: int, tokens: list[int], reps: int, chunk: int, depth: int) -> dict[int, dict[str, float]]:
    import torch

    from connector.config import PdbenchConfig
    from connector.layout import PagedKV
    from connector.staging import Stager
    from connector.transport import Completions, IOLoop, KVClient, PullJob

    need = {t: -(-t // BS) for t in tokens}
    n_blocks = max(need.values()) * 2 + 8
    reqs = [(f"r{t}-{i}", list(range(need[t]))) for t in tokens for i in range(reps + 1)]
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    srv = ctx.Process(target=_server, args=(port, n_blocks, reqs, chunk, depth, ready, stop), daemon=True)
    srv.start()
    assert ready.wait(120), "server did not start"
    _pin({4, 5})
    caches = gpu_caches(n_blocks, seed=None)
    kv = PagedKV(caches, n_blocks, BS)
    cfg = PdbenchConfig(chunk_bytes=chunk, pipeline_depth=depth)
    done = Completions()
    io = IOLoop("bench-client")
    client = KVClient(kv, Stager(kv, chunk, depth), cfg, done)
    expected = gpu_caches(n_blocks, seed=1)  # what the server holds
    out: dict[int, dict[str, float]] = {}
    try:
        for t in tokens:
            dst = list(range(n_blocks - 1, n_blocks - 1 - need[t], -1))
            walls = []
            for i in range(reps + 1):
                job = PullJob(f"d{t}-{i}", f"r{t}-{i}", "P", "127.0.0.1", port, 0, dst, dst)
                t0 = time.perf_counter()
                ok = io.submit(client.pull(job)).result(300)
                wall = time.perf_counter() - t0
                assert ok and done.drain_stats() is not None, "pull failed"
                if i:
                    walls.append(wall)
            src_idx = torch.arange(need[t], device="cuda")
            dst_idx = torch.tensor(dst, device="cuda")
            for name in caches:
                assert torch.equal(caches[name].index_select(0, dst_idx), expected[name].index_select(0, src_idx)), name
            out[t] = {"pull_s": statistics.median(walls)}
    finally:
        io.stop()
        stop.set()
        srv.join(20)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1024,4096,16384")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--chunk-mib", default="8")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--port", type=int, default=15690)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import torch
    from bench_connector_transfer import raw_tcp

    tokens = [int(x) for x in a.tokens.split(",")]
    sizes = [-(-t // BS) * BS * token_bytes() for t in tokens]
    limits = copy_limits()
    raw = raw_tcp(a.port, sizes, max(3, a.reps // 2))
    rows = []
    for k, chunk_mib in enumerate(float(x) for x in a.chunk_mib.split(",")):
        res = pipeline(a.port + 1 + k, tokens, a.reps, int(chunk_mib * 2**20), a.depth)
        for t, size in zip(tokens, sizes, strict=False):
            tcp = size / raw[size] / 1e9
            bound = min(limits["d2h"], limits["h2d"], tcp)
            r = {
                "tokens": t,
                "bytes": size,
                "chunk_mib": chunk_mib,
                "d2h_gbps": limits["d2h"],
                "h2d_gbps": limits["h2d"],
                "tcp_gbps": tcp,
                "pull_gbps": size / res[t]["pull_s"] / 1e9,
            }
            r["pull_vs_bound"] = r["pull_gbps"] / bound
            rows.append(r)
    print(
        f"GPU: {torch.cuda.get_device_name()}; layout {LAYERS} layers x {BS}-token blocks, bf16, "
        f"{HEADS} KV heads x {DIM}; pinned D2H {limits['d2h']:.1f} GB/s, H2D {limits['h2d']:.1f} GB/s"
    )
    print(f"{'tokens':>6} {'MB':>8} {'chunk':>6} {'raw TCP':>9} {'pull':>9} {'pull/min(limits)':>17}")
    for r in rows:
        print(
            f"{r['tokens']:>6} {r['bytes'] / 1e6:>8.1f} {r['chunk_mib']:>5g}M {r['tcp_gbps']:>8.2f}G "
            f"{r['pull_gbps']:>8.2f}G {r['pull_vs_bound']:>17.2f}"
        )
    print("pull = request .. ack, GPU to GPU; limits: pinned copies and raw loopback TCP, same run; GB/s = 1e9 B/s")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
