"""NIXL READ between two processes, shaped like vLLM 0.20's NixlConnector pull, and the GPU copy
ceiling beside it (docs/gpu.md, "The NIXL KV handoff on two H200s"). Needs torch and nixl-cu13
on a CUDA machine; runs nothing of pdbench.

    python3 benchmarks/bench_nixl_pull.py ceiling OUT.json
    python3 benchmarks/bench_nixl_pull.py driver OUTDIR TAG TOKENS_CSV [REPS]

`driver` starts a target ("prefill": CUDA_VISIBLE_DEVICES=1,0) and an initiator ("decode":
0,1; with PROBE_SAME_GPU=1 both on GPU 0). Each allocates PROBE_LAYERS (32) tensors holding a
K and a V region of PROBE_BLOCKS blocks of PROBE_BLOCK_KIB (32 KiB: one layer's K or V for
PROBE_TPB=16 tokens of an 8B Llama, bf16) and registers them with NIXL's UCX backend
(num_threads PROBE_THREADS=4, vLLM 0.20's default). The initiator preps one descriptor per
(region, block), as vLLM does, and READs TOKENS/TPB blocks of every region with
make_prepped_xfer: ascending blocks merge into one descriptor per region (64), descending ones
(PROBE_ORDER=reverse: the order vLLM hands out blocks once its pool has wrapped) never merge.
Per transfer it prints post (transfer()) and completion times, NIXL's telemetry (post, xfer,
bytes, descriptors) and whether the bytes arrived; OUTDIR/TAG.json holds the rows,
OUTDIR/TAG.*.log each side's output (UCX_PROTO_INFO=y unless set: UCX's protocol table).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

BLOCK = int(os.environ.get("PROBE_BLOCK_KIB", "32")) * 1024
TPB = int(os.environ.get("PROBE_TPB", "16"))
LAYERS = int(os.environ.get("PROBE_LAYERS", "32"))
NB = int(os.environ.get("PROBE_BLOCKS", "49152"))  # 32 x 2 x 49152 x 32 KiB = 96 GiB per side
REVERSE = os.environ.get("PROBE_ORDER", "") == "reverse"
WAIT_S = 300


def _agent(name: str) -> Any:
    from nixl_cu13._api import nixl_agent, nixl_agent_config

    threads = int(os.environ.get("PROBE_THREADS", "4"))
    return nixl_agent(name, nixl_agent_config(num_threads=threads, capture_telemetry=True))


def _alloc() -> list[Any]:
    import torch

    return [torch.empty(2 * NB * BLOCK, dtype=torch.uint8, device="cuda:0") for _ in range(LAYERS)]


def _regions(tensors: list[Any]) -> list[int]:
    out = []
    for x in tensors:
        out += [x.data_ptr(), x.data_ptr() + NB * BLOCK]
    return out


def _wait_for(path: str, limit_s: float) -> None:
    end = time.time() + limit_s
    while not os.path.exists(path):
        if time.time() > end:
            raise SystemExit(f"bench_nixl_pull: {path} did not appear within {limit_s:.0f} s")
        time.sleep(0.1)


def target(d: str) -> None:
    import torch

    ts = _alloc()
    for layer, x in enumerate(ts):
        x[: NB * BLOCK].fill_(2 * layer + 1)
        x[NB * BLOCK :].fill_(2 * layer + 2)
    torch.cuda.synchronize()
    a = _agent("target")
    a.register_memory([(x.data_ptr(), x.numel(), 0, "") for x in ts], "cuda")
    with open(f"{d}/target.meta.tmp", "wb") as f:
        f.write(a.get_agent_metadata())
    with open(f"{d}/target.regions.tmp", "w") as f:
        json.dump(_regions(ts), f)
    os.rename(f"{d}/target.regions.tmp", f"{d}/target.regions")
    os.rename(f"{d}/target.meta.tmp", f"{d}/target.meta")
    end = time.time() + 3 * WAIT_S
    while not os.path.exists(f"{d}/done") and time.time() < end:
        a.get_new_notifs()
        time.sleep(0.01)


def _dlist(bases: list[int]) -> Any:
    import numpy as np

    arr = np.empty((len(bases) * NB, 3), dtype=np.uint64)
    for r, b in enumerate(bases):
        arr[r * NB : (r + 1) * NB, 0] = b + np.arange(NB, dtype=np.uint64) * BLOCK
    arr[:, 1] = BLOCK
    arr[:, 2] = 0
    return arr


def initiator(d: str, tokens: list[int], reps: int) -> list[dict[str, Any]]:
    import numpy as np
    import torch

    ts = _alloc()
    for x in ts:
        x.zero_()
    a = _agent("initiator")
    a.register_memory([(x.data_ptr(), x.numel(), 0, "") for x in ts], "cuda")
    _wait_for(f"{d}/target.meta", WAIT_S)
    with open(f"{d}/target.meta", "rb") as f:
        rname = a.add_remote_agent(f.read())
    with open(f"{d}/target.regions") as f:
        rreg = json.load(f)
    lreg = _regions(ts)
    t0 = time.time()
    lh = a.prep_xfer_dlist("NIXL_INIT_AGENT", a.get_xfer_descs(_dlist(lreg), "cuda"))
    rh = a.prep_xfer_dlist(rname, a.get_xfer_descs(_dlist(rreg), "cuda"))
    print(f"prep {time.time() - t0:.1f} s for {2 * len(lreg) * NB} descriptors", flush=True)
    rows = []
    start = 0
    for tok in tokens:
        nb = tok // TPB
        for rep in range(reps):
            if start + nb > NB:
                start = 0
            blocks = np.arange(start, start + nb)
            start += nb
            if REVERSE:
                blocks = blocks[::-1]
            idx = (np.arange(len(lreg))[:, None] * NB + blocks[None, :]).reshape(-1).tolist()
            h = a.make_prepped_xfer("READ", lh, idx, rh, idx, b"probe")
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            state = a.transfer(h)
            t2 = time.perf_counter()
            end = time.time() + 120
            while state == "PROC" and time.time() < end:
                state = a.check_xfer_state(h)
            t3 = time.perf_counter()
            tel = a.get_xfer_telemetry(h)
            b0, b1 = int(blocks.min()) * BLOCK, int(blocks.max() + 1) * BLOCK
            ok = True
            for layer in (0, LAYERS - 1):
                x = ts[layer]
                ok &= bool((x[b0:b1] == 2 * layer + 1).all())
                ok &= bool((x[NB * BLOCK + b0 : NB * BLOCK + b1] == 2 * layer + 2).all())
            nbytes = nb * BLOCK * len(lreg)
            row = {
                "tokens": tok,
                "rep": rep,
                "state": state,
                "bytes": nbytes,
                "post_ms": (t2 - t1) * 1e3,
                "total_ms": (t3 - t1) * 1e3,
                "gbps": nbytes / (t3 - t1) / 1e9,
                "tel_post_ms": tel.postDuration / 1e3,
                "tel_xfer_ms": tel.xferDuration / 1e3,
                "tel_bytes": tel.totalBytes,
                "tel_descs": tel.descCount,
                "data_ok": ok,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            a.release_xfer_handle(h)
    return rows


def driver(out: str, tag: str, tokens: str, reps: int) -> int:
    d = tempfile.mkdtemp(prefix="nixl-pull-")
    env = dict(os.environ)
    env.setdefault("UCX_PROTO_INFO", "y")
    same = os.environ.get("PROBE_SAME_GPU") == "1"
    limit = int(os.environ.get("PROBE_TIMEOUT_S", str(WAIT_S)))
    with open(f"{out}/{tag}.target.log", "w") as logt, open(f"{out}/{tag}.initiator.log", "w") as logi:
        pt = subprocess.Popen(
            [sys.executable, __file__, "target", d],
            env={**env, "CUDA_VISIBLE_DEVICES": "0" if same else "1,0"},
            stdout=logt,
            stderr=subprocess.STDOUT,
        )
        pi = subprocess.Popen(
            [sys.executable, __file__, "initiator", d, tokens, str(reps), f"{out}/{tag}.json"],
            env={**env, "CUDA_VISIBLE_DEVICES": "0" if same else "0,1"},
            stdout=logi,
            stderr=subprocess.STDOUT,
        )
        try:
            rc = pi.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            pi.kill()
            rc = -9
        open(f"{d}/done", "w").close()
        try:
            pt.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pt.kill()
    print(f"bench_nixl_pull {tag}: initiator rc={rc}", flush=True)
    return rc


def ceiling(path: str) -> None:
    """GPU 1 -> GPU 0 copy of the same byte counts in one process: one copy, and 64 of 1/64 each."""
    import torch

    out: dict[str, Any] = {"can_access_peer_0_1": torch.cuda.can_device_access_peer(0, 1), "rows": []}
    src = torch.empty(6 << 30, dtype=torch.uint8, device="cuda:1")
    dst = torch.empty(6 << 30, dtype=torch.uint8, device="cuda:0")
    src.fill_(7)
    for tok in (4096, 16384, 24576, 32768, 49152):
        n = tok * 128 * 1024
        for chunks in (1, 64):
            step = n // chunks
            times = []
            for rep in range(6):
                torch.cuda.synchronize(0)
                torch.cuda.synchronize(1)
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                with torch.cuda.device(0):
                    e0.record()
                    for c in range(chunks):
                        dst[c * step : (c + 1) * step].copy_(src[c * step : (c + 1) * step], non_blocking=True)
                    e1.record()
                e1.synchronize()
                if rep:  # the first is the warm-up
                    times.append(e0.elapsed_time(e1))
            ms = statistics.median(times)
            row = {"tokens": tok, "bytes": n, "chunks": chunks, "ms": round(ms, 3), "gbps": round(n / ms / 1e6, 1)}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    if not bool((dst[: 1 << 20] == 7).all()):
        raise SystemExit("bench_nixl_pull: the peer copy did not arrive")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def main(argv: list[str]) -> int:
    role = argv[1] if len(argv) > 1 else ""
    if role == "target":
        target(argv[2])
    elif role == "initiator":
        rows = initiator(argv[2], [int(t) for t in argv[3].split(",")], int(argv[4]))
        with open(argv[5], "w") as f:
            json.dump(rows, f, indent=1)
    elif role == "driver":
        return 0 if driver(argv[2], argv[3], argv[4], int(argv[5]) if len(argv) > 5 else 3) == 0 else 1
    elif role == "ceiling":
        ceiling(argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
