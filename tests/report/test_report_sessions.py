"""The report's workload tables from pdbench's result sections: TTFT by turn (`sessions`), a trace
replay's timing (`schedule`) and each role's prefix-cache hits (`prefix_cache`), each read through
its one model on the run directory's floor; a malformed section is named and left out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.report import output_md, output_text
from harness.report.build import build_report
from harness.rundir.prefix_cache_summary import PrefixCacheSummary
from harness.rundir.schedule_summary import ScheduleSummary
from harness.rundir.session_summary import SessionSummary

pytestmark = pytest.mark.timeout(60)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"


def _stats(p50: float | None) -> dict:
    return {"mean": p50, "p50": p50, "p90": None if p50 is None else p50 * 1.5, "p99": None if p50 is None else p50 * 2}


SESSIONS = {
    "turns": 3,
    "sessions_started": 8,
    "sessions_completed": 8,
    "think_time": {"distribution": "exponential", "mean_s": 0.5},
    "by_turn": [
        {
            "turn": 1,
            "requests": 8,
            "completed": 8,
            "ttft_ms": _stats(80.0),
            "tpot_ms": _stats(6.0),
            "prompt_tokens_mean": 256,
        },
        {
            "turn": 2,
            "requests": 8,
            "completed": 8,
            "ttft_ms": _stats(35.0),
            "tpot_ms": _stats(6.2),
            "prompt_tokens_mean": 544,
        },
        {
            "turn": 3,
            "requests": 8,
            "completed": 7,
            "ttft_ms": _stats(38.5),
            "tpot_ms": _stats(6.4),
            "prompt_tokens_mean": 832,
        },
    ],
    "session_duration_s": _stats(3.2),
    "sentinels": "4 sentinels beside the sessions",
}
SCHEDULE = {
    "requests": 40,
    "sent": 40,
    "speed": 2.0,
    "span_s": 9.5,
    "cap": 4,
    "in_flight_max": 4,
    "cap_delayed": 3,
    "lateness_ms": {"p50": 0.2, "p99": 41.0, "max": 80.0},
    "client_lateness_ms": {"p50": 0.1, "p99": 0.6, "max": 0.9},
}
COUNTS = {"external_queries": None, "external_hits": None, "external_hit_rate": None}
PREFIX_CACHE = {
    "enabled": True,
    "roles": {
        "prefill": {"queries": 4096, "hits": 2560, "hit_rate": 0.625} | COUNTS,
        "decode": {
            "queries": 4096,
            "hits": 0,
            "hit_rate": 0.0,
            "external_queries": 4096,
            "external_hits": 4000,
            "external_hit_rate": 0.9765625,
        },
    },
    "instances": [],
    "text": "prefix caching on, hit rate 62.5% on prefill",
}


def _run(tmp_path: Path, conc: int, **sections: object) -> Path:
    run = tmp_path / "tiny-fp32-cpu-nixl-1p1d" / FIXTURE.name
    if not run.exists():
        shutil.copytree(FIXTURE, run)
    (f,) = run.glob(f"concurrency_{conc}_*.json")
    f.write_text(json.dumps(json.loads(f.read_text()) | sections))
    return run


def test_the_sections_are_the_models_the_writers_use() -> None:
    SessionSummary.model_validate(SESSIONS)
    ScheduleSummary.model_validate(SCHEDULE)
    PrefixCacheSummary.model_validate(PREFIX_CACHE)


def test_ttft_by_turn_trace_timing_and_prefix_cache_tables(tmp_path: Path) -> None:
    _run(tmp_path, 1, schedule=SCHEDULE)
    run = _run(tmp_path, 4, sessions=SESSIONS, prefix_cache=PREFIX_CACHE)
    report = build_report([run])
    tables = {t.title: t for t in report.sections}
    assert list(tables) == ["TTFT by turn (multi-turn sessions)", "Trace replay timing", "Prefix cache"]
    turns = tables["TTFT by turn (multi-turn sessions)"]
    rows = [dict(zip(turns.headers, r, strict=True)) for r in turns.rows]
    assert [(r["Conc"], r["Turn"], r["Completed"], r["Prompt tokens"], r["TTFT p50"], r["TTFT p99"]) for r in rows] == [
        ("4", "1", "8/8", "256", "80.0", "160.0"),
        ("4", "2", "8/8", "544", "35.0", "70.0"),
        ("4", "3", "7/8", "832", "38.5", "77.0"),
    ]
    (timing,) = [
        dict(zip(tables["Trace replay timing"].headers, r, strict=True)) for r in tables["Trace replay timing"].rows
    ]
    assert (timing["Conc"], timing["Speed"], timing["Late p99"], timing["Client late p99"], timing["Cap-delayed"]) == (
        "1",
        "2",
        "41.0",
        "0.6",
        "3",
    )
    cache = [dict(zip(tables["Prefix cache"].headers, r, strict=True)) for r in tables["Prefix cache"].rows]
    assert [(c["Role"], c["Caching"], c["Hit rate"], c["External"]) for c in cache] == [
        ("prefill", "on", "62.5%", "–"),
        ("decode", "on", "0.0%", "97.7%"),
    ]
    md = output_md.render(report)
    assert "## TTFT by turn (multi-turn sessions)" in md and "| 4 | 3 | 7/8 | 832 | 38.5 |" in md
    assert "Prefix cache" in output_text.render(report, width=200)


def test_a_malformed_section_is_named_and_left_out(tmp_path: Path) -> None:
    bad = SESSIONS | {"by_turn": SESSIONS["by_turn"][:2]}  # type: ignore[index]
    run = _run(tmp_path, 4, sessions=bad)
    report = build_report([run])
    assert report.sections == []
    (note,) = [n for n in report.notes if "sessions" in n]
    assert "by_turn must hold turns 1 to 3 in order" in note and "its per-turn table is not shown" in note
    assert len(report.table) == 2  # the point itself is still in the table
