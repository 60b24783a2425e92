"""A run directory of disaggregated and aggregated points for the decide/report tests, and the headless browser that shows its HTML."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from harness.rundir import ResultName
from helpers.bench_results import bench_result

OSL = 100

# (serving, isl, conc) -> (total tok/s, median TPOT ms, p99 TTFT ms); 3 GPUs either way.
POINTS = {
    ("disagg", 1024, 1): (300.0, 10.0, 100.0),
    ("disagg", 1024, 4): (900.0, 20.0, 300.0),
    ("agg", 1024, 1): (240.0, 12.5, 80.0),
    ("agg", 1024, 4): (600.0, 25.0, 500.0),
    ("disagg", 4096, 1): (600.0, 10.0, 400.0),
    ("agg", 4096, 1): (1200.0, 10.0, 200.0),
}


def write_decide_run(run: Path) -> None:
    run.mkdir(parents=True)
    for (kind, isl, conc), (tput, tpot, ttft) in POINTS.items():
        if kind == "disagg":
            md = {"disagg": True, "prefill_gpus": 1, "decode_gpus": 2, "recipe": "r", "valid": True}
            name = ResultName(conc, math.inf, f"isl_{isl}_osl_{OSL}", prefill_gpus=1, decode_gpus=2).filename
        else:
            md = {"disagg": False, "gpus": 3, "tp": 1, "recipe": "r", "valid": True}
            name = ResultName(conc, math.inf, f"isl_{isl}_osl_{OSL}", gpus=3).filename
        md["validity"] = {"verdict": "valid", "valid": True, "reasons": []}
        part = lambda ms: {"mean": ms, "median": ms, "p99": ms}  # noqa: E731
        breakdown = {"requests": 1, "of": 1, "ttft_ms": part(ttft / 2), "router_ms": part(1.0)}
        if kind == "disagg":
            breakdown |= {"prefill_ms": part(ttft / 4), "kv_transfer_ms": {"mean": 5.0, "transfers": 1}}
            breakdown |= {"decode_ms": part(ttft / 4 - 2.0), "client_ms": part(1.0)}
        else:
            breakdown |= {"decode_ms": part(ttft / 2 - 2.0), "client_ms": part(1.0)}
        r = bench_result(
            max_concurrency=conc,
            random_input_len=isl,
            random_output_len=OSL,
            total_token_throughput=tput,
            output_throughput=tput / 2,
            median_tpot_ms=tpot,
            p99_ttft_ms=ttft,
            median_ttft_ms=ttft / 2,
            metadata=md,
            ttft_breakdown=breakdown,
        )
        (run / name).write_text(r.model_dump_json())


def headless_browser() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        pytest.fail("no headless browser (scripts/setup.sh installs Debian's chromium)")
    return exe
