"""AMD GPUs, through amd-smi's JSON: enough of them, and none held by another process."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping

from harness.node.preflight.gpu_holders import BUSY_HINT, Holder, busy_text
from harness.node.preflight.text import to_int
from harness.node.preflight.tool import ToolFailed, run_tool

_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "kib": 1 << 10, "mb": 1 << 20, "mib": 1 << 20, "gb": 1 << 30, "gib": 1 << 30}


def check_amd(tool: str, expected: int, env: Mapping[str, str], limit_s: float) -> list[str]:
    deadline = time.monotonic() + limit_s
    hint = (
        f"the recipe needs {expected} GPU(s) on this node (check the amdgpu driver and that the container "
        "is given /dev/kfd and /dev/dri; `amd-smi list` on the node shows the same error)"
    )
    try:
        list_out, _ = run_tool([tool, "list", "--json"], deadline - time.monotonic(), env, limit_s)
        gpus = _entries(_json_from(list_out))
    except ToolFailed as e:
        return [f"{e}; {hint}"]
    except ValueError as e:
        return [f"could not read `amd-smi list --json` ({e}); {hint}"]
    problems: list[str] = []
    if len(gpus) < expected:
        problems.append(
            f"{len(gpus)} GPU(s) visible, the recipe needs {expected} on this node "
            "(the container or the Slurm allocation does not expose them all: check --gres / the container's "
            "/dev/dri devices)"
        )
    try:
        proc_out, tool_pid = run_tool([tool, "process", "--json"], deadline - time.monotonic(), env, limit_s)
    except ToolFailed as e:
        return [*problems, f"{e}; cannot tell whether the GPUs are free"]
    try:
        entries = _entries(_json_from(proc_out))
    except ValueError as e:
        if "no running process" in proc_out.lower():
            return problems
        return [*problems, f"could not read `amd-smi process --json` ({e}); cannot tell whether the GPUs are free"]
    for n, entry in enumerate(entries):
        holders = _holders(entry, tool_pid)
        if holders:
            gpu = entry.get("gpu", n)
            problems.append(f"GPU {gpu} is busy: {busy_text(holders)} {BUSY_HINT}")
    return problems


def _json_from(text: str) -> object:
    """The first JSON value in `text` (amd-smi may print warnings before it)."""
    starts = [i for i in (text.find("["), text.find("{")) if i >= 0]
    if not starts:
        raise ValueError("no JSON in the output")
    value, _ = json.JSONDecoder().raw_decode(text[min(starts) :])
    return value


def _entries(data: object) -> list[dict]:
    """amd-smi's per-GPU entries: a list of dicts, a single dict, or a dict wrapping a list."""
    if isinstance(data, list):
        return [d for d in data if isinstance(d, dict)]
    if isinstance(data, dict):
        if "gpu" in data:
            return [data]
        for value in data.values():
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                return list(value)
        return [v for v in data.values() if isinstance(v, dict)]
    return []


def _bytes(value: object) -> float | None:
    """A memory amount from amd-smi JSON: 123, "123 MB", {"value": 123, "unit": "B"}; None if not given."""
    unit = "b"
    if isinstance(value, dict):
        unit = str(value.get("unit", "B")).strip().lower()
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) * _UNITS.get(unit, 1)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]*)\s*", value)
        if m:
            try:
                return float(m.group(1)) * _UNITS.get(m.group(2).lower(), 1)
            except ValueError:
                return None
    return None


def _holders(entry: dict, tool_pid: int) -> list[Holder]:
    plist = entry.get("process_list", entry.get("processes", []))
    if not isinstance(plist, list):
        return []
    out: list[Holder] = []
    for item in plist:
        info = item.get("process_info", item) if isinstance(item, dict) else item
        if not isinstance(info, dict):
            continue  # "No running processes detected"
        pid = info.get("pid")
        pid = pid if isinstance(pid, int) else to_int(str(pid)) if pid is not None else None
        if pid == tool_pid:
            continue  # newer amd-smi lists itself
        mib = _vram_mib(info)
        if mib is not None:
            out.append((pid, str(info.get("name") or ""), mib))
    return out


def _vram_mib(info: dict) -> float | None:
    """The VRAM a process holds, in MiB, from the first field amd-smi's version reports; None when none or zero."""
    usage = info.get("memory_usage")
    candidates = [usage.get("vram_mem")] if isinstance(usage, dict) else []
    candidates += [info.get("vram_mem"), info.get("mem_usage"), info.get("mem")]
    amounts = [b for b in (_bytes(c) for c in candidates) if b is not None]
    if amounts and amounts[0] > 0:
        return amounts[0] / (1 << 20)
    return None
