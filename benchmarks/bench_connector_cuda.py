"""The connector's CUDA paths against their limits: GPU -> pinned host -> TCP -> pinned host ->
GPU (target `tcp`), and same-host CUDA IPC, GPU to GPU with TCP carrying only pull/ok/ack
(target `ipc`; `ipc-peer`, prefill on GPU 1 and decode on GPU 0, where 2 GPUs exist).

Needs torch with CUDA, not vLLM. Two processes share the GPU: a KVServer holding a
paged KV cache on the GPU and a KVClient pulling requests into its own GPU cache,
both through `connector.staging.Stager` (gather to a pinned ring on a copy stream,
D2H overlapped with sending; receive into pinned slots, H2D + scatter overlapped with
receiving). Layout: 28 layers, 16-token blocks, bf16, 4 KV heads x 128 dims, K and V
in separate halves of each layer (blocks are strided, as in vLLM's flash-attention
cache). The same run measures the limits: pinned D2H and H2D copy bandwidth and raw
loopback TCP between two processes for `tcp`; for `ipc`, one torch copy of the same bytes
on one GPU (and GPU 1 -> GPU 0 peer copy where 2 GPUs exist), and the same gather/scatter
of blocks done within one process. Received blocks are checked bit for bit.

The raw-TCP ceiling is bench_connector_transfer.raw_tcp_ceiling, as that benchmark's: the
best median over socket-buffer settings (kernel autotuning, 1, 4, 8 (the connector's own)
and 32 MiB), each on its own connection, with buffers sized to the largest request.

Goals (PASS/FAIL per row, exit 0 only if every row passes; a target that fails to run is
a FAIL):
* tcp: pull >= 0.70 of min(pinned D2H, pinned H2D, raw-TCP ceiling) at every size: the
  staging ring must hide the copies behind the wire (0.70 is the transport's own goal
  against raw TCP, bench_connector_transfer.py);
* ipc: pull - block copy <= 2 ms at every size: what a pull adds to moving the bytes (round
  trip, launch, blocking wait, ack) stays a small share of a GPU prefill's TTFT.
  The block copy is the same path's: the gather within GPU 0 for ipc; one peer copy of the
  bytes, GPU 1 -> 0, for ipc-peer (the link, not the GPU's memory, is its limit);
* ipc-peer from 16k tokens also: pull >= 0.70 of one plain peer copy of the same bytes.

Nothing waits unbounded: a pull with no progress for 20 s (a raw transfer: 60 s) fails, and
every pull has a deadline that grows with its size.

    python3 benchmarks/bench_connector_cuda.py [--tokens 1024,4096,16384] [--reps 8] [--targets tcp,ipc] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYERS, BS, HEADS, DIM = 28, 16, 4, 128
TCP_GOAL = 0.70  # tcp pull / min(pinned D2H, pinned H2D, raw-TCP ceiling)
IPC_OVERHEAD_GOAL_MS = 2.0  # ipc pull time - the block copy's own time
# A peer pull from this many tokens on moves at least this share of a plain peer copy's rate
# (the goal two GPUs of one node set: below it the link, not the pull, should be the limit).
PEER_SHARE_GOAL, PEER_SHARE_FROM_TOKENS = 0.70, 16384
STALL_S = 20.0  # the connector's io_timeout_s here: a pull with no progress for this long fails


def pull_bound_s(nbytes: int) -> float:
    """Deadline of one whole pull: start-up costs plus its bytes at 50 MB/s, far below any
    path measured; the connector's own waits fail a stall sooner (STALL_S without progress)."""
    return 60.0 + nbytes / 50e6


def gpu_caches(n_blocks: int, seed: int | None, device: str = "cuda") -> dict[str, Any]:
    import torch

    g = torch.Generator(device=device)
    out = {}
    for i in range(LAYERS):
        raw = torch.empty(2, n_blocks, BS, HEADS, DIM, dtype=torch.bfloat16, device=device)
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


def _time_gpu(fn: Any, reps: int = 8, inner: int = 5) -> float:
    """Median seconds of one `fn` on the current stream, `inner` back to back per timing so
    that the GPU, not the host's launch, sets the pace (first timing is a warm-up)."""
    import torch

    times = []
    for i in range(reps + 1):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        e.synchronize()
        if i:
            times.append(s.elapsed_time(e) / 1e3 / inner)
    return statistics.median(times)


def d2d_limits(sizes: list[int], tokens: list[int]) -> dict[str, dict[int, float]]:
    """GB/s of one torch copy of each size on GPU 0, GPU 1 -> 0 (2 GPUs), and of the
    connector's gather/scatter of the same blocks (reversed destinations) in one process."""
    import torch

    peer = torch.cuda.device_count() > 1 and torch.cuda.can_device_access_peer(0, 1)
    out: dict[str, dict[int, float]] = {"d2d": {}, "peer": {}, "gather": {}}
    for size, t in zip(sizes, tokens, strict=True):
        out["d2d"][t] = size / _copy_s(size, "cuda:0") / 1e9
        if peer:
            out["peer"][t] = size / _copy_s(size, "cuda:1") / 1e9
        out["gather"][t] = size / _gather_s(-(-t // BS)) / 1e9
    return out


def _copy_s(size: int, src_device: str) -> float:
    import torch

    src = torch.empty(size, dtype=torch.uint8, device=src_device)
    dst = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    return _time_gpu(lambda: dst.copy_(src, non_blocking=True))


def _gather_s(n: int) -> float:
    import torch

    from connector import gather
    from connector.staging import _wide_pair

    src, dst = gpu_caches(n, seed=1), gpu_caches(2 * n, seed=None)
    sidx = torch.arange(n, device="cuda")
    didx = torch.arange(2 * n - 1, n - 1, -1, device="cuda")
    plan = gather.make_plan([_wide_pair(src[name], dst[name]) for name in src])  # as the connector does
    return _time_gpu(lambda: gather.launch(plan, 0, LAYERS, sidx, didx, 16 << 20))


def _pin(cores: set[int]) -> None:
    os.sched_setaffinity(0, cores & os.sched_getaffinity(0) or os.sched_getaffinity(0))


# -- the connector's pulls -------------------------------------------------------------------


def _server(
    port: int,
    n_blocks: int,
    reqs: list[tuple[str, list[int]]],
    chunk: int,
    depth: int,
    device: str,
    ready: Any,
    stop: Any,
) -> None:
    _pin({2, 3})  # like a prefill worker: its own cores for model thread, IO and event waits
    from connector.config import PdbenchConfig
    from connector.layout import PagedKV
    from connector.staging import Stager
    from connector.transport import Completions, IOLoop, KVServer

    kv = PagedKV(gpu_caches(n_blocks, seed=1, device=device), n_blocks, BS)
    cfg = PdbenchConfig(port=port, lease_s=3600, chunk_bytes=chunk, pipeline_depth=depth, io_timeout_s=STALL_S)
    io = IOLoop("bench-server")
    srv = KVServer(kv, Stager(kv, chunk, depth, wait_s=STALL_S), cfg, "P", port, Completions())
    io.submit(srv.start()).result(10)
    for rid, blocks in reqs:
        io.call(srv.register, rid, blocks)
    ready.set()
    stop.wait(3600)
    io.stop()


def pipeline(
    port: int, tokens: list[int], reps: int, chunk: int, depth: int, ipc: bool = False, prefill_device: str = "cuda:0"
) -> dict[int, dict[str, float]]:
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
    srv = ctx.Process(
        target=_server, args=(port, n_blocks, reqs, chunk, depth, prefill_device, ready, stop), daemon=True
    )
    srv.start()
    saved = os.sched_getaffinity(0)
    io = None
    try:
        if not ready.wait(120):
            raise RuntimeError("KV server did not start in 120 s")
        _pin({4, 5})
        caches = gpu_caches(n_blocks, seed=None)
        kv = PagedKV(caches, n_blocks, BS)
        cfg = PdbenchConfig(chunk_bytes=chunk, pipeline_depth=depth, ipc=ipc, io_timeout_s=STALL_S)
        done = Completions()
        io = IOLoop("bench-client")
        client = KVClient(kv, Stager(kv, chunk, depth, wait_s=STALL_S), cfg, done)
        expected = {  # what the server holds, made on its GPU
            k: v.to("cuda") for k, v in gpu_caches(n_blocks, seed=1, device=prefill_device).items()
        }
        out: dict[int, dict[str, float]] = {}
        for t in tokens:
            dst = list(range(n_blocks - 1, n_blocks - 1 - need[t], -1))
            bound = pull_bound_s(need[t] * BS * token_bytes())
            walls = []
            for i in range(reps + 1):
                job = PullJob(f"d{t}-{i}", f"r{t}-{i}", "P", "127.0.0.1", port, 0, dst, dst)
                t0 = time.perf_counter()
                try:
                    ok = io.submit(client.pull(job)).result(bound)
                except TimeoutError:
                    raise RuntimeError(f"pull of {t} tokens did not finish in {bound:.0f} s") from None
                wall = time.perf_counter() - t0
                st = done.drain_stats()
                if not ok or st is None:
                    raise RuntimeError(f"pull of {t} tokens failed (the connector's log says why)")
                if (st.recv_ipc, st.recv_tcp) != ((1, 0) if ipc else (0, 1)):
                    raise RuntimeError(f"pull of {t} tokens took the other path ({st.recv_ipc} ipc, {st.recv_tcp} tcp)")
                if i:
                    walls.append(wall)
            src_idx = torch.arange(need[t], device="cuda")
            dst_idx = torch.tensor(dst, device="cuda")
            for name in caches:
                if not torch.equal(caches[name].index_select(0, dst_idx), expected[name].index_select(0, src_idx)):
                    raise RuntimeError(f"{t} tokens: {name} differs from prefill's after the pull")
            out[t] = {"pull_s": statistics.median(walls)}
        return out
    finally:
        if io is not None:
            io.stop()
        stop.set()
        srv.join(20)
        if srv.is_alive():
            srv.kill()
        os.sched_setaffinity(0, saved)


# -- goals -----------------------------------------------------------------------------------


def judge(rows: list[dict[str, Any]]) -> bool:
    """Prints one PASS/FAIL line per row against its goal; True when every row passed."""
    print("\ngoals:")
    for r in rows:
        where = f"{r['target']:>8} {r['tokens']:>6} tokens" if "tokens" in r else f"{r['target']:>8}"
        print(f"  {'PASS' if r['pass'] else 'FAIL'} {where}: {r['goal']}")
    ok = bool(rows) and all(r["pass"] for r in rows)
    failed = sum(not r["pass"] for r in rows)
    print(f"RESULT: {'PASS' if ok else 'FAIL'} ({len(rows) - failed} of {len(rows)} rows met their goal)")
    return ok


def failed_target(target: str, exc: BaseException) -> dict[str, Any]:
    return {"target": target, "pass": False, "goal": f"did not run to the end: {type(exc).__name__}: {exc}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1024,4096,16384")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--chunk-mib", default="8", help="TCP staging chunks (a list: one run each); IPC uses the first")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--targets", default="tcp,ipc")
    ap.add_argument("--port", type=int, default=15690)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    targets = a.targets.split(",")
    unknown = sorted(set(targets) - {"tcp", "ipc"})
    if unknown:
        ap.error(f"--targets: unknown {unknown}; choose from tcp, ipc")
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    import torch

    if not torch.cuda.is_available():
        print("FAIL: no CUDA device (this benchmark needs torch with CUDA)")
        return 1
    tokens = [int(x) for x in a.tokens.split(",")]
    sizes = [-(-t // BS) * BS * token_bytes() for t in tokens]
    chunks = [float(x) for x in a.chunk_mib.split(",")]
    print(
        f"GPU: {torch.cuda.get_device_name()} x{torch.cuda.device_count()}; layout {LAYERS} layers x {BS}-token "
        f"blocks, bf16, {HEADS} KV heads x {DIM}, K/V halves outside the block dim (strided blocks); "
        f"{os.cpu_count()} CPUs, load {load()}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    tcp_rows: list[dict[str, Any]] = []
    if "tcp" in targets:
        try:
            tcp_rows = run_tcp(a, tokens, sizes, chunks)
        except Exception as exc:
            tcp_rows = [failed_target("tcp", exc)]
        rows += tcp_rows
    if "ipc" in targets:
        try:
            rows += run_ipc(a, tokens, sizes, chunks[0], [r for r in tcp_rows if "pull_gbps" in r])
        except Exception as exc:
            rows.append(failed_target("ipc", exc))
    ok = judge(rows)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


def progress(what: str, since: float) -> None:
    print(f"  {what} ({time.perf_counter() - since:.1f} s)", flush=True)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg()) + " (1/5/15 min)"


def run_tcp(a: Any, tokens: list[int], sizes: list[int], chunks: list[float]) -> list[dict[str, Any]]:
    from benchmarks.bench_connector_transfer import RAW_BUFS, raw_tcp_ceiling

    t0 = time.perf_counter()
    limits = copy_limits()
    raw = raw_tcp_ceiling(a.port, sizes, max(3, a.reps // 2))
    progress("tcp: copy limits and raw-TCP ceiling measured", t0)
    rows = []
    for k, chunk_mib in enumerate(chunks):
        t0 = time.perf_counter()
        res = pipeline(a.port + 1 + k, tokens, a.reps, int(chunk_mib * 2**20), a.depth)
        progress(f"tcp: pulls with {chunk_mib:g} MiB chunks done", t0)
        for t, size in zip(tokens, sizes, strict=True):
            tcp = raw[size].gbps(size)
            bound = min(limits["d2h"], limits["h2d"], tcp)
            r = {
                "target": "tcp",
                "tokens": t,
                "bytes": size,
                "chunk_mib": chunk_mib,
                "d2h_gbps": limits["d2h"],
                "h2d_gbps": limits["h2d"],
                "tcp_gbps": tcp,
                "tcp_setting": raw[size].setting,
                "pull_gbps": size / res[t]["pull_s"] / 1e9,
            }
            r["pull_vs_bound"] = r["pull_gbps"] / bound
            r["pass"] = r["pull_vs_bound"] >= TCP_GOAL
            r["goal"] = f"pull / min(limits) {r['pull_vs_bound']:.2f} >= {TCP_GOAL} ({chunk_mib:g} MiB chunks)"
            rows.append(r)
    print(f"\ntcp: pinned D2H {limits['d2h']:.1f} GB/s, H2D {limits['h2d']:.1f} GB/s; load {load()}")
    print(
        f"{'tokens':>6} {'MB':>8} {'chunk':>6} {'raw TCP':>9} {'(buffers)':>12} {'pull':>9} "
        f"{'pull/min(limits)':>17}  conditions"
    )
    for r in rows:
        print(
            f"{r['tokens']:>6} {r['bytes'] / 1e6:>8.1f} {r['chunk_mib']:>5g}M {r['tcp_gbps']:>8.2f}G "
            f"{r['tcp_setting'].split(' (')[0]:>12} {r['pull_gbps']:>8.2f}G {r['pull_vs_bound']:>17.2f}  same GPU, 2 processes, "
            f"loopback TCP, depth {a.depth}, {a.reps} reps (median)"
        )
    print(
        "pull = request .. ack, GPU to GPU; limits: pinned copies and the raw loopback TCP ceiling (best of "
        f"socket buffers {', '.join(f'{b >> 20} MiB' if b else 'autotuning' for b in RAW_BUFS)}; connector: "
        "8 MiB; sender on core 0, receiver on core 1), same run; pulls: prefill on cores 2-3, decode on 4-5; "
        "GB/s = 1e9 B/s"
    )
    return rows


def copy_path(short: bool = False) -> str:
    from connector import gather

    if gather.triton is not None:
        return "Triton" if short else "one Triton launch for all layers"
    return "torch" if short else "torch index_select/index_copy_ per layer"


def run_ipc(
    a: Any, tokens: list[int], sizes: list[int], chunk_mib: float, tcp_rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    import torch

    t0 = time.perf_counter()
    lim = d2d_limits(sizes, tokens)
    chunk = int(chunk_mib * 2**20)
    runs = {"ipc": pipeline(a.port + 50, tokens, a.reps, chunk, a.depth, ipc=True)}
    if lim["peer"]:
        runs["ipc-peer"] = pipeline(a.port + 51, tokens, a.reps, chunk, a.depth, ipc=True, prefill_device="cuda:1")
    progress("ipc: limits and pulls done", t0)
    where = {"ipc": "same GPU", "ipc-peer": "GPU 1 -> GPU 0"}
    first_chunk = tcp_rows[0]["chunk_mib"] if tcp_rows else None
    tcp = {r["tokens"]: r["pull_gbps"] for r in tcp_rows if r["chunk_mib"] == first_chunk}
    rows = []
    for target, res in runs.items():
        for t, size in zip(tokens, sizes, strict=True):
            gbps = size / res[t]["pull_s"] / 1e9
            peer = target == "ipc-peer"
            # The floor of the same path: a peer pull's block copy reads GPU 1 over the link, so it
            # is held to a plain peer copy of the bytes (Triton refuses a kernel on another GPU's
            # memory unless IPC mapped it, so the peer gather cannot be timed in one process).
            copy = lim["peer"][t] if peer else lim["d2d"][t]
            block_copy = copy if peer else lim["gather"][t]
            r = {"target": target, "tokens": t, "bytes": size, "chunk_mib": chunk_mib, "pull_gbps": gbps}
            r["conditions"] = f"{where[target]}, 2 processes, {a.reps} reps (median), {copy_path(short=True)}"
            r.update(copy_gbps=copy, gather_gbps=block_copy, pull_vs_copy=gbps / copy)
            r.update(pull_vs_gather=gbps / block_copy, pull_vs_tcp=gbps / tcp[t] if t in tcp else None)
            # What the pull adds to the block copy itself: round trip, launch, blocking wait, ack.
            r["overhead_ms"] = (res[t]["pull_s"] - size / (block_copy * 1e9)) * 1e3
            r["pass"] = r["overhead_ms"] <= IPC_OVERHEAD_GOAL_MS
            r["goal"] = f"pull - block copy {r['overhead_ms']:.2f} ms <= {IPC_OVERHEAD_GOAL_MS:g} ms"
            if peer and t >= PEER_SHARE_FROM_TOKENS:
                r["pass"] = r["pass"] and r["pull_vs_copy"] >= PEER_SHARE_GOAL
                r["goal"] += f"; pull / peer copy {r['pull_vs_copy']:.2f} >= {PEER_SHARE_GOAL:g}"
            rows.append(r)
    print(
        f"\nipc: 2 processes; decode gathers prefill's {BS}-token blocks (opened via CUDA IPC) into reversed, "
        f"non-adjacent blocks of its own with {copy_path()}; {torch.cuda.get_device_name()}"
    )
    print(
        f"{'target':>8} {'tokens':>6} {'MB':>8} {'pull':>9} {'copy':>9} {'pull/copy':>10} "
        f"{'gather':>9} {'pull/gather':>12} {'+ms':>6} {'pull/tcp':>9}  conditions"
    )
    for r in rows:
        vs_tcp = f"{r['pull_vs_tcp']:>9.1f}" if r["pull_vs_tcp"] else f"{'-':>9}"
        print(
            f"{r['target']:>8} {r['tokens']:>6} {r['bytes'] / 1e6:>8.1f} {r['pull_gbps']:>8.1f}G "
            f"{r['copy_gbps']:>8.1f}G {r['pull_vs_copy']:>10.2f} {r['gather_gbps']:>8.1f}G "
            f"{r['pull_vs_gather']:>12.2f} {r['overhead_ms']:>6.2f} {vs_tcp}  {r['conditions']}"
        )
    print(
        "pull = request .. ack (TCP round trip, copies, blocking-sync wait, ack); copy = one torch copy_ of the "
        "same bytes, same GPU (ipc) or GPU 1 -> 0 (ipc-peer); gather = the block copy's floor: the connector's gather "
        "alone, one process, same GPU (ipc), or the peer copy (ipc-peer); +ms = pull time - block copy time; pull/tcp: against the tcp "
        "target's pull (first chunk size), same run; GB/s = 1e9 B/s"
    )
    return rows


if __name__ == "__main__":
    sys.exit(main())
