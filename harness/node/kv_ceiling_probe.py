"""The same-job KV ceiling's measurement (harness.node.kv_ceiling runs it; the record's format:
harness.rundir.kv_ceiling). Run inside a server's own interpreter (`python -c <this file's text>`),
so it sees that server's torch and GPUs; prints one JSON object on stdout.

Standard library only, torch when CUDA is there: the rate the KV's path could have at most.
- GPUs given and CUDA there: one device-to-device copy of `bytes` from the source GPU (prefill's)
  to the destination GPU (decode's), timed with CUDA events: a peer copy between two GPUs, an
  on-device copy when both are the same GPU (two instances on one GPU).
- else: a host memory copy of `bytes` between two buffers (what a loopback or shared-memory KV
  path is bounded by), timed with perf_counter.
Each copy is done once untimed, then `repeats` times timed; the rates are bytes over each time.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from typing import Any


def _host(nbytes: int, repeats: int) -> dict[str, Any]:
    src, dst = bytearray(b"\x01") * nbytes, bytearray(nbytes)
    s, d = memoryview(src), memoryview(dst)
    d[:] = s  # untimed: the pages are touched once
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        d[:] = s
        times.append(time.perf_counter() - t0)
    cpu = platform.processor() or platform.machine()
    return {"method": "host_memcpy", "src_device": f"host ({cpu})", "dst_device": f"host ({cpu})", "seconds": times}


def _cuda(torch: Any, src: int, dst: int, nbytes: int, repeats: int) -> dict[str, Any]:
    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
    b.copy_(a)  # untimed: peer access is set up by the first copy
    torch.cuda.synchronize(src)
    torch.cuda.synchronize(dst)
    times = []
    with torch.cuda.device(dst):
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            b.copy_(a, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)

    def name(i: int) -> str:
        return f"cuda:{i} {torch.cuda.get_device_name(i)}"

    method = "cuda_device_copy" if src == dst else "cuda_peer_copy"
    peer = None if src == dst else bool(torch.cuda.can_device_access_peer(dst, src))
    return {"method": method, "src_device": name(src), "dst_device": name(dst), "seconds": times, "peer_access": peer}


def _gpu_device_nodes() -> bool:
    """Whether this host (or container) has NVIDIA's or ROCm's device nodes, without which
    torch.cuda finds no GPU."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


def measure(src: int | None, dst: int | None, gpu_bytes: int, host_bytes: int, repeats: int) -> dict[str, Any]:
    """The measurement as the record's fields (harness.rundir.kv_ceiling.KvCeiling, less the node's)."""
    reason = ""
    if src is not None and dst is not None and not _gpu_device_nodes():
        # torch's import alone costs a CPU node's job more than a second of CPU
        reason = "no GPU device node (/dev/nvidiactl, /dev/kfd) here: a host copy"
    elif src is not None and dst is not None:
        try:
            import torch  # only where a server's interpreter has it

            if torch.cuda.is_available() and max(src, dst) < torch.cuda.device_count():
                out = _cuda(torch, src, dst, gpu_bytes, repeats)
                return out | {"bytes": gpu_bytes, "repeats": repeats}
            reason = f"no CUDA GPU {max(src, dst)} here: a host copy"
        except ImportError:
            reason = "no torch in the server's interpreter: a host copy"
    return _host(host_bytes, repeats) | {"bytes": host_bytes, "repeats": repeats, "reason": reason}


def main(argv: list[str]) -> None:
    """argv: SRC DST GPU_BYTES HOST_BYTES REPEATS (SRC/DST "-": no GPU, a host copy)."""
    src, dst, gpu_bytes, host_bytes, repeats = argv

    def gpu(v: str) -> int | None:
        return None if v == "-" else int(v)

    print(json.dumps(measure(gpu(src), gpu(dst), int(gpu_bytes), int(host_bytes), int(repeats))))


if __name__ == "__main__":
    main(sys.argv[1:])
