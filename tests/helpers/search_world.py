"""A search whose jobs' points come from a simulated disaggregated server of known timing
(harness.predict.simulate): the world of the prediction tests and benchmarks/bench_search_prediction.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from harness.predict.simulate import SimConfig, simulate
from harness.search.driver import Search, prepare
from harness.search.space import Candidate
from helpers.search_launcher import SEARCH, FakeLauncher

LADDER = [1, 2, 4, 8, 16]

PROMPTS = 32

SLOS = {"decode": {"tpot_p90": 13.0}}


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


def world_point(c: Candidate, prefill: int, decode: int, conc: int, isl: int, osl: int, seed: int) -> dict[str, Any]:
    """One point of the world as `pdbench bench` writes a result file."""
    cfg = SimConfig(
        "disagg",
        conc,
        isl,
        osl,
        prefill,
        decode,
        prefill_ms=lambda tokens: 2.0 + 0.05 * tokens,
        decode_step_ms=lambda b: 4.0 + 2.0 * b,
        kv_ms=1.0,
        overhead_ms=1.0,
        max_num_seqs=64,
        prefill_jitter_ms=0.3,
        step_jitter_ms=0.2,
        requests=PROMPTS,
        seed=1000 + seed,
    )
    r = simulate(cfg)
    ttft, tpot = r.ttft_ms, r.tpot_ms
    out_tps = r.output_throughput
    e2el = sorted(a + (osl - 1) * b for a, b in zip(r.ttft_ms, r.tpot_ms, strict=True))
    return {
        "backend": "openai",
        "model_id": "tiny",
        "num_prompts": PROMPTS,
        "request_rate": "inf",
        "max_concurrency": conc,
        "random_input_len": isl,
        "random_output_len": osl,
        "duration": r.duration_s,
        "benchmark_start_time_unix": 0.0,
        "benchmark_end_time_unix": r.duration_s,
        "completed": PROMPTS,
        "failed": 0,
        "total_input_tokens": PROMPTS * isl,
        "total_output_tokens": PROMPTS * osl,
        "request_throughput": PROMPTS / r.duration_s,
        "output_throughput": out_tps,
        "total_token_throughput": out_tps * (isl + osl) / osl,
        "ttfts": [t / 1000 for t in r.ttft_ms],
        "mean_ttft_ms": sum(ttft) / len(ttft),
        "median_ttft_ms": pct(ttft, 50),
        "p90_ttft_ms": pct(ttft, 90),
        "p99_ttft_ms": pct(ttft, 99),
        "mean_tpot_ms": sum(tpot) / len(tpot),
        "median_tpot_ms": pct(tpot, 50),
        "p90_tpot_ms": pct(tpot, 90),
        "p99_tpot_ms": pct(tpot, 99),
        "median_itl_ms": pct(tpot, 50),
        "p90_itl_ms": pct(tpot, 90),
        "mean_e2el_ms": sum(e2el) / len(e2el),
        "median_e2el_ms": pct(e2el, 50),
        "p90_e2el_ms": pct(e2el, 90),
        "metadata": {
            "disagg": True,
            "recipe": "tiny-fp32-cpu-nixl-1p2d",
            "valid": True,
            "validity": {"verdict": "valid", "valid": True, "reasons": []},
            "prefill_gpus": c.prefill_devices,
            "decode_gpus": c.decode_devices,
            "prefill_num_workers": prefill,
            "decode_num_workers": decode,
        },
    }


def begin(tmp_path: Path, fake: FakeLauncher, **changes: Any) -> Search:
    spec = {
        **SEARCH,
        "set": [*SEARCH["set"], f"benchmark.min_prompts={PROMPTS}"],
        "slos": SLOS,
        "concurrency": LADDER,
        "prune": {"enabled": True, "slack": 1.1},
        "baseline": {"aggregated": False},
        "budget": {"nodes_in_flight": 3},  # one job at a time: each decision sees the ones before
        **changes,
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    s = prepare(
        str(path),
        search_dir=tmp_path / "search",
        results_dir=tmp_path / "results",
        launcher_kind="slurm",
        cluster=None,
        skip_flag_check=True,
    )
    s.make_launcher = lambda kind, rr: fake
    s.poll_s = 0.01
    fake.sdir = s.sdir
    return s
