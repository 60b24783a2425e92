"""connector/cpu_engine_fork.py: vLLM's CPU platform spawns every engine core; the plugin makes a
one-rank server's engine core a fork when the server's environment asks. Real vLLM servers run it
in the vllm stage (tests/e2e/test_e2e_vllm.py reads its line in a job's server log); here its parts."""

from __future__ import annotations

import os
import sys
import types
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import pytest

from connector import cpu_engine_fork as fork
from harness.config.load import load_catalogue


class _CpuLikePlatform:
    """Stands in for vLLM's CpuPlatform: its config hook sets spawn whatever the environment says."""

    calls = 0

    @classmethod
    def check_and_update_config(cls, vllm_config: object) -> None:
        cls.calls += 1
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"


def _config(world_size: int, dp: int = 1) -> SimpleNamespace:
    return SimpleNamespace(parallel_config=SimpleNamespace(world_size=world_size, data_parallel_size=dp))


@pytest.fixture
def platform(monkeypatch: pytest.MonkeyPatch) -> type[_CpuLikePlatform]:
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")  # restored after the test
    monkeypatch.setattr(fork, "_log", lambda message: None)  # vLLM's logger: not imported here
    return type("Platform", (_CpuLikePlatform,), {"calls": 0})


def test_the_plugin_is_registered_with_vllm() -> None:
    found = [e for e in entry_points(group="vllm.general_plugins") if e.value == "connector.cpu_engine_fork:register"]
    assert len(found) == 1, "pyproject.toml's vllm.general_plugins entry is not installed (scripts/setup.sh)"
    assert found[0].load() is fork.register


def test_a_one_rank_server_forks_and_a_larger_one_keeps_spawn(platform: type[_CpuLikePlatform]) -> None:
    platform.check_and_update_config(_config(1))
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # the platform's own choice, unwrapped
    assert fork.fork_one_rank_engines(platform) is True
    platform.check_and_update_config(_config(1))
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert platform.calls == 2  # vLLM's hook still ran
    for world_size, dp in ((2, 1), (1, 2)):
        platform.check_and_update_config(_config(world_size, dp))
        assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn", (world_size, dp)


def test_wrapping_twice_wraps_once(platform: type[_CpuLikePlatform]) -> None:
    assert fork.fork_one_rank_engines(platform) is True
    hook = platform.__dict__["check_and_update_config"]
    assert fork.fork_one_rank_engines(platform) is False
    assert platform.__dict__["check_and_update_config"] is hook
    platform.check_and_update_config(_config(1))
    assert platform.calls == 1


@pytest.mark.parametrize("value", [None, "0"])
def test_register_changes_nothing_unless_asked(
    platform: type[_CpuLikePlatform], monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    cpu = types.ModuleType("vllm.platforms.cpu")
    cpu.CpuPlatform = platform  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.platforms.cpu", cpu)
    hook = platform.check_and_update_config.__func__
    if value is None:
        monkeypatch.delenv(fork.ENV, raising=False)
    else:
        monkeypatch.setenv(fork.ENV, value)
    fork.register()
    assert platform.check_and_update_config.__func__ is hook
    monkeypatch.setenv(fork.ENV, "1")
    fork.register()
    assert platform.check_and_update_config.__func__ is not hook
    platform.check_and_update_config(_config(1))
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_the_cpu_models_ask_for_it() -> None:
    models = load_catalogue(Path(__file__).resolve().parents[2] / "models.yaml").models
    cpu = [name for name, m in models.items() if m.env.get("VLLM_CPU_KVCACHE_SPACE")]
    assert {"tiny-llama", "pdbench-copy"} <= set(cpu)
    assert all(models[name].env.get(fork.ENV) == "1" for name in cpu), cpu
