"""A finished 1P1D run (the committed fixture) with judged bottleneck sections written into its points."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.rundir.bottleneck_summary import Baseline, RoleTiming
from harness.validity.bottleneck import judge

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
)

CLIENT = {"cpu_busy": [0.3], "loop_lag_ms": {"median": 0.1, "p99": 0.4}, "warnings": []}

LOW_ROLES = {
    "prefill": RoleTiming(requests=12, queue_ms=0.4, compute_ms=48.0, tpot_ms=0.0),
    "decode": RoleTiming(requests=12, queue_ms=25.0, compute_ms=19.0, tpot_ms=12.8),
}

HIGH_ROLES = LOW_ROLES | {"prefill": RoleTiming(requests=36, queue_ms=30.0, compute_ms=141.0, tpot_ms=0.0)}

PARTS = {"ttft_ms": 128.0, "router_ms": 0.4, "prefill_ms": 66.0, "decode_ms": 61.0, "client_ms": 0.6}


def bottleneck_sections() -> tuple[dict, dict]:
    low = judge(PARTS, LOW_ROLES, 14.0, 12.0, CLIENT, None, e2el_ms=500.0)
    base = Baseline(concurrency=1, roles=LOW_ROLES, kv_transfer_ms=14.0)
    high_parts = PARTS | {"ttft_ms": 329.0, "prefill_ms": 245.0, "decode_ms": 83.0}
    high = judge(high_parts, HIGH_ROLES, 9.0, 14.0, CLIENT, base, e2el_ms=763.0)
    return low.model_dump(mode="json"), high.model_dump(mode="json")


def bottleneck_run(tmp_path: Path, sections: dict[int, object]) -> Path:
    run = tmp_path / "tiny-fp32-cpu-nixl-1p1d" / FIXTURE.name
    shutil.copytree(FIXTURE, run)
    for conc, section in sections.items():
        (f,) = run.glob(f"concurrency_{conc}_*.json")
        f.write_text(json.dumps(json.loads(f.read_text()) | {"bottleneck": section}))
    return run
