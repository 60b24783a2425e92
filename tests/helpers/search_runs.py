"""Run directories and results of finished search candidates, as the search outcome and report read them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from harness.search.space import Candidate

LAUNCHED = 1_795_669_000.0

STARTED = LAUNCHED + 3.0  # the job waited 3 s in the queue, then its nodes started

TIGHT = {"ttft_p90": 800.0, "tpot_p90": 40.0}

LOOSE = {"ttft_p90": 3000.0}

SLOS = {"tight": TIGHT, "loose": LOOSE}

ONE_P_ONE_D = Candidate("1p1d", "disagg", (), 1, 1, 2, {"prefill": 1.0, "decode": 1.0})


def result(
    conc: int,
    *,
    total: float,
    ttft_p90: float = 100.0,
    tpot_p90: float = 10.0,
    median_tpot: float = 8.0,
    started: float,
    repeat: int = 0,
    failed: int = 0,
    stop_reason: str | None = None,
    verdict: str = "valid",
    disagg: bool = True,
    prefill_gpus: int = 1,
    decode_gpus: int = 1,
) -> dict[str, Any]:
    """A result file as `pdbench bench` writes one (the keys by their real names, fewer of them)."""
    metadata: dict[str, Any] = {
        "pdbench_version": "0.1.0",
        "disagg": disagg,
        "recipe": "tiny-fp32-cpu-nixl-1p1d",
        "recipe_fingerprint": "65afccaa4a0cde83",
        "valid": verdict == "valid",
        "validity": {"verdict": verdict, "valid": verdict == "valid", "reasons": [] if verdict == "valid" else ["kv"]},
        "slo_search": {"repeat": repeat, "slos": {}},
    }
    if disagg:
        metadata |= {"prefill_gpus": prefill_gpus, "decode_gpus": decode_gpus}
    else:
        metadata["gpus"] = prefill_gpus
    return {
        "date": "20261126-050324",
        "backend": "openai",
        "model_id": "tiny",
        "num_prompts": 8,
        "request_rate": "inf",
        "max_concurrency": conc,
        "random_input_len": 256,
        "random_output_len": 32,
        "stop_reason": stop_reason,
        "duration": 2.0,
        "benchmark_start_time_unix": started,
        "benchmark_end_time_unix": started + 2.0,
        "completed": 8 - failed,
        "failed": failed,
        "total_input_tokens": 2048,
        "total_output_tokens": 256,
        "request_throughput": 4.0,
        "output_throughput": total / 9,
        "total_token_throughput": total,
        "mean_ttft_ms": ttft_p90 * 0.8,
        "median_ttft_ms": ttft_p90 * 0.8,
        "p90_ttft_ms": ttft_p90,
        "p99_ttft_ms": ttft_p90 * 1.1,
        "mean_tpot_ms": median_tpot,
        "median_tpot_ms": median_tpot,
        "p90_tpot_ms": tpot_p90,
        "p99_tpot_ms": tpot_p90 * 1.1,
        "median_itl_ms": median_tpot,
        "p90_itl_ms": tpot_p90,
        "median_e2el_ms": 400.0,
        "p90_e2el_ms": 450.0,
        "metadata": metadata,
    }


def name(conc: int, disagg: bool = True) -> str:
    return f"concurrency_{conc}_req_rate_inf_gpus_2" + ("_ctx_1_gen_1" if disagg else "") + ".json"


def write_run(
    path: Path,
    points: list[dict[str, Any]],
    *,
    repeats: dict[int, list[dict[str, Any]]] | None = None,
    finished_at: float | None = 0.0,
    slo_search: dict[str, Any] | None = None,
) -> Path:
    """A run directory as a finished job leaves it: plan, launch record, the nodes' rendezvous
    records, results, repeats/<k>/, slo_search.json and status.json (finished_at 0.0: one second
    after the last point)."""
    path.mkdir(parents=True)
    (path / "plan.json").write_text(json.dumps({"processes": [], "num_nodes": 2, "proxy_node": 0}))
    launch = {"launcher": "slurm", "job_id": "7", "host": "vm", "time": LAUNCHED, "pid": None, "create_time": None}
    (path / "launch.json").write_text(json.dumps(launch))
    (path / "nodes").mkdir()
    for node, at in ((0, STARTED + 1.0), (1, STARTED)):  # each node's rendezvous record, as it starts
        (path / "nodes" / f"{node}.json").write_text(json.dumps({"node": node, "addr": "10.77.0.11"}))
        os.utime(path / "nodes" / f"{node}.json", (at, at))
    for data in points:
        (path / name(data["max_concurrency"], data["metadata"]["disagg"])).write_text(json.dumps(data))
    for k, pts in (repeats or {}).items():
        (path / "repeats" / str(k)).mkdir(parents=True)
        for data in pts:
            (path / "repeats" / str(k) / name(data["max_concurrency"])).write_text(json.dumps(data))
    if slo_search is not None:
        (path / "slo_search.json").write_text(json.dumps(slo_search))
    if finished_at is not None:
        every = points + [p for pts in (repeats or {}).values() for p in pts]
        end = finished_at or max(p["benchmark_end_time_unix"] for p in every) + 1.0
        status = {"state": "succeeded", "exit_code": 0, "reason": None, "failure": None, "finished_at": end}
        (path / "status.json").write_text(json.dumps(status))
    return path


def ladder_run(tmp_path: Path) -> Path:
    """1, 2, 4 meet the tight SLO; 8 then 6 break its TPOT bound; 4 is measured twice more."""
    t = LAUNCHED + 30.0  # 30 s of start-up
    pts = [
        result(1, total=400.0, started=t),
        result(2, total=700.0, started=t + 10),
        result(4, total=1100.0, started=t + 20, tpot_p90=30.0),
        result(8, total=1500.0, started=t + 30, tpot_p90=55.0, ttft_p90=900.0),
        result(6, total=1300.0, started=t + 40, tpot_p90=45.0),
    ]
    reps = {
        1: [result(4, total=1080.0, started=t + 50, repeat=1)],
        2: [result(4, total=1120.0, started=t + 60, repeat=2)],
    }
    record = {"ladder": [1, 2, 4, 6, 8], "slos": SLOS, "best": {"tight": 4, "loose": 8}, "done": True}
    return write_run(tmp_path / "run", pts, repeats=reps, slo_search=record)


LADDER = [1, 2, 4, 6, 8]

AGG = Candidate("agg-2", "agg", (), 2, 0, 1, {"aggregated": 2.0})

TWO_P_ONE_D = Candidate("2p1d", "disagg", (), 2, 1, 3, {"prefill": 2.0, "decode": 1.0})
