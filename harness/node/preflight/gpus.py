"""The node's GPUs: at least as many as the recipe needs, none held by another process."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from harness.node.preflight.amd import check_amd
from harness.node.preflight.nvidia import check_nvidia


def check_gpus(
    expected: int, vendor: str = "auto", env: Mapping[str, str] | None = None, timeout_s: float = 10
) -> list[str]:
    """The node has at least `expected` GPUs and none of them holds another process's memory.
    The whole node is checked (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES are ignored): the job owns it."""
    if expected <= 0:
        return []
    env = os.environ if env is None else env
    path = env.get("PATH", os.defpath)
    nvidia_smi = shutil.which("nvidia-smi", path=path)
    amd_smi = shutil.which("amd-smi", path=path)
    if vendor == "auto":
        if nvidia_smi:
            return check_nvidia(nvidia_smi, expected, env, timeout_s)
        if amd_smi:
            return check_amd(amd_smi, expected, env, timeout_s)
        return [f"no GPU tool (nvidia-smi or amd-smi) on PATH; the recipe needs {expected} GPU(s) on this node"]
    if vendor == "nvidia":
        if nvidia_smi:
            return check_nvidia(nvidia_smi, expected, env, timeout_s)
        return [f"nvidia-smi is not on PATH; the recipe needs {expected} NVIDIA GPU(s) on this node"]
    if vendor == "amd":
        if amd_smi:
            return check_amd(amd_smi, expected, env, timeout_s)
        return [f"amd-smi is not on PATH; the recipe needs {expected} AMD GPU(s) on this node"]
    return [f"unknown GPU vendor {vendor!r} (expected auto, nvidia or amd)"]
