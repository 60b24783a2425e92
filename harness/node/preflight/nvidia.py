"""NVIDIA GPUs, through nvidia-smi: enough of them, and none held by another process."""

from __future__ import annotations

import time
from collections.abc import Mapping

from harness.node.preflight.gpu_holders import BUSY_HINT, Holder, busy_text
from harness.node.preflight.text import to_float, to_int
from harness.node.preflight.tool import ToolFailed, run_tool

# An idle GPU shows a few MiB (up to a few hundred with persistence mode / ECC); more than
# this with no process listed means something outside this container holds it.
IDLE_GPU_MIB = 2048


def check_nvidia(tool: str, expected: int, env: Mapping[str, str], limit_s: float) -> list[str]:
    deadline = time.monotonic() + limit_s
    try:
        gpus_out, _ = run_tool(
            [tool, "--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits"],
            deadline - time.monotonic(),
            env,
            limit_s,
        )
    except ToolFailed as e:
        return [
            f"{e}; the recipe needs {expected} GPU(s) on this node (check the GPU driver and that the "
            "container is given the GPUs; `nvidia-smi` on the node shows the same error)"
        ]
    index_of, used = _read_gpus(gpus_out)
    problems: list[str] = []
    if len(used) < expected:
        problems.append(
            f"{len(used)} GPU(s) visible, the recipe needs {expected} on this node "
            "(the container or the Slurm allocation does not expose them all: check --gres / the container's GPU flags)"
        )
    try:
        apps_out, _ = run_tool(
            [tool, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
            deadline - time.monotonic(),
            env,
            limit_s,
        )
    except ToolFailed as e:
        return [*problems, f"{e}; cannot tell whether the GPUs are free"]
    return problems + _busy_problems(_read_holders(apps_out), index_of, used)


def _read_gpus(out: str) -> tuple[dict[str, int], dict[int, float | None]]:
    """(GPU index by uuid, MiB used by index) from --query-gpu=index,uuid,memory.used."""
    index_of: dict[str, int] = {}
    used: dict[int, float | None] = {}
    for line in out.splitlines():
        cols = [c.strip() for c in line.split(",")]
        idx = to_int(cols[0]) if len(cols) >= 2 else None
        if idx is None:
            continue
        index_of[cols[1]] = idx
        used[idx] = to_float(cols[2]) if len(cols) > 2 else None
    return index_of, used


def _read_holders(out: str) -> dict[str, list[Holder]]:
    """Processes holding memory, by GPU uuid, from --query-compute-apps=gpu_uuid,pid,used_memory."""
    holders: dict[str, list[Holder]] = {}
    for line in out.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 2 or to_int(cols[1]) is None:
            continue  # "No running processes found" and the like
        mib = to_float(cols[2]) if len(cols) > 2 else None
        if mib is not None and mib <= 0:
            continue
        holders.setdefault(cols[0], []).append((to_int(cols[1]), "", mib))
    return holders


def _busy_problems(
    holders: dict[str, list[Holder]], index_of: dict[str, int], used: dict[int, float | None]
) -> list[str]:
    problems: list[str] = []
    for uuid, procs in sorted(holders.items(), key=lambda kv: (index_of.get(kv[0], 1 << 30), kv[0])):
        where = f"GPU {index_of[uuid]}" if uuid in index_of else f"the GPU with uuid {uuid}"
        problems.append(f"{where} is busy: {busy_text(procs)} {BUSY_HINT}")
    busy = {index_of[u] for u in holders if u in index_of}
    for idx, mib in sorted(used.items()):
        if idx not in busy and mib is not None and mib > IDLE_GPU_MIB:
            problems.append(
                f"GPU {idx} has {mib:.0f} MiB in use but nvidia-smi lists no process on it (a process in another "
                "container or PID namespace, e.g. an orphaned container from an earlier job?); "
                "free it, or have the node drained, before the run"
            )
    return problems
