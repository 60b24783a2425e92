"""`pdbench report RUN --slo ...` on one run (no aggregated baseline) picks the run's best point
under the bounds and says, point by point, which met them and why the others did not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli_run import pdbench

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests" / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
pytestmark = pytest.mark.timeout(120)


def _latencies() -> dict[int, dict[str, float]]:
    points = [json.loads(p.read_text()) for p in RUN.glob("concurrency_*.json")]
    return {d["max_concurrency"]: d for d in points}


def _section(report: dict) -> dict:
    (t,) = [s for s in report["sections"] if s["title"].startswith("Under the SLO")]
    return t


def test_one_run_gets_its_best_point_under_the_slo(tmp_path: Path) -> None:
    pts = _latencies()
    # Precondition: the run's two points, C=1 faster to first token, C=4 more throughput.
    assert sorted(pts) == [1, 4] and pts[1]["p99_ttft_ms"] < 500 < pts[4]["p99_ttft_ms"] < 2000, pts
    assert pts[4]["total_token_throughput"] > pts[1]["total_token_throughput"]

    # A loose bound: both meet it, and the higher throughput wins.
    r = pdbench("report", str(RUN), "--slo", "ttft_p99=2000", "--format", "json")
    assert r.returncode == 0, r.stderr
    t = _section(json.loads(r.stdout))
    assert [row[3] for row in t["rows"]] == ["1", "4"] and [row[-2] for row in t["rows"]] == ["yes", "yes"], t
    (finding,) = t["findings"]
    assert "best under ttft_p99 <= 2000 ms: C=4, 1,053.7 tok/s/GPU (2 of 2 points meet it)" in finding, finding

    # A tight bound: C=4 misses it, by its own p99, and C=1 is chosen.
    r = pdbench("report", str(RUN), "--slo", "ttft_p99=500", "--format", "md")
    assert r.returncode == 0, r.stderr
    assert "not applied" not in r.stdout + r.stderr, r.stdout
    assert f"| no | ttft_p99 {pts[4]['p99_ttft_ms']:.1f} ms > 500 ms |" in r.stdout, r.stdout
    assert "best under ttft_p99 <= 500 ms: C=1, 428.3 tok/s/GPU (1 of 2 points meet it)" in r.stdout, r.stdout

    # Bounds none meets, one of them on a latency the results lack: each point says why.
    r = pdbench(
        "report", str(RUN), "--slo", "tpot_p99=1,e2el_p95=1", "--format", "text", "--out", str(tmp_path / "r.txt")
    )
    assert r.returncode == 0, r.stderr
    # With --out the answer is on stderr too, as the notes are.
    assert "slo: tiny-fp32-cpu-nixl-1p1d/20261122T032441Z-e8da34 (disagg, ISL 256, OSL 32): no point meets" in r.stderr
    text = " ".join((tmp_path / "r.txt").read_text().split())
    assert "no point meets tpot_p99 <= 1 ms, e2el_p95 <= 1 ms (2 judged" in text, text
    assert f"tpot_p99 {pts[1]['p99_tpot_ms']:.1f} ms > 1 ms; e2el_p95: the result has no p95_e2el_ms" in text, text
