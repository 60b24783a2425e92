"""A vLLM general plugin: on the CPU platform, the engine core of a one-rank server forked from
the API server instead of spawned, when the server's environment asks (PDBENCH_CPU_ENGINE_FORK=1,
models.yaml's CPU models).

`vllm serve` starts its engine core as a process of its own. vLLM's CPU platform sets
VLLM_WORKER_MULTIPROC_METHOD=spawn whatever the environment says
(`CpuPlatform.check_and_update_config`), so that process imports torch and vLLM again: on a
2-core machine 17 s of CPU and 13-17 s of a tiny model's 43-47 s to healthy (forked: 30 s, its
engine core 7 s of CPU; vLLM 0.32, the same answers). Spawn is the CPU platform's safe default
because a child forked after OpenMP's thread pool started in the parent can hang; on other
platforms vLLM itself forks the engine core from the same API server (unless CUDA is already
initialised), and every CPU job of the CI served through a forked core (not a proof that no
parent ever starts OpenMP first). A server with one rank (`uni`, no data parallelism) starts no
further process from its engine core, which is the only case this plugin touches.
Servers with more ranks keep spawn (their workers start from the engine core after it ran torch).

vLLM loads it through the `vllm.general_plugins` entry point (pyproject.toml) in every process
before it builds its config; without the variable it changes nothing. It imports nothing of
harness, as the rest of `connector/`.
"""

from __future__ import annotations

import functools
import os
from typing import Any

# Set by the server's environment (models.yaml `env`), read when vLLM loads its plugins.
ENV = "PDBENCH_CPU_ENGINE_FORK"
_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
_MARK = "_pdbench_engine_fork"


def register() -> None:
    """vLLM's plugin hook (called once or more per process): wrap the CPU platform's config hook
    when the environment asks for it."""
    if os.environ.get(ENV) != "1":
        return
    from vllm.platforms.cpu import CpuPlatform

    fork_one_rank_engines(CpuPlatform)


def one_rank(vllm_config: Any) -> bool:
    """Whether the server runs one engine of one rank (the only case forked)."""
    parallel = vllm_config.parallel_config
    return int(parallel.world_size) == 1 and int(parallel.data_parallel_size) == 1


def fork_one_rank_engines(platform: Any) -> bool:
    """Wrap `platform.check_and_update_config` so that, after it ran, a one-rank server's engine
    core starts by fork; returns False when the platform was already wrapped (plugins load in
    several places of one process)."""
    original = platform.check_and_update_config.__func__
    if getattr(original, _MARK, False):
        return False

    @functools.wraps(original)
    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        original(cls, vllm_config)
        if one_rank(vllm_config):
            os.environ[_METHOD_ENV] = "fork"
            _log(f"{ENV}=1: one rank, so the engine core is forked, not spawned ({_METHOD_ENV}=fork)")

    setattr(check_and_update_config, _MARK, True)
    platform.check_and_update_config = classmethod(check_and_update_config)
    return True


def _log(message: str) -> None:
    # Under vLLM's logger, so the line lands in the server's log with vLLM's own.
    from vllm.logger import init_logger

    init_logger(f"vllm.{__name__}").info(message)
