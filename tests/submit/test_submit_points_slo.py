"""A run's planned points under an SLO search (harness.submit.points): the ladder values the
search never needed are not shown as missing results in `pdbench status` and submit's summary."""

from __future__ import annotations

import json
from pathlib import Path

from harness.bench.client_config import ClientConfig
from harness.rundir import ResultName, RunDir
from harness.submit.points import planned

LADDER = [1, 2, 4, 8, 16]


def _run(tmp_path: Path, slo_search: dict | None) -> RunDir:
    path = tmp_path / "results" / "r" / "20261126T050000Z-abc123"
    path.mkdir(parents=True)
    run = RunDir(path)
    cfg = dict(
        base_url="http://127.0.0.1:1",
        model="m",
        tokenizer="t",
        isl=8,
        osl=8,
        concurrency=LADDER,
        result_dir=str(path),
        prefill_gpus=1,
        decode_gpus=1,
    )
    if slo_search is not None:
        cfg["slo_search"] = slo_search
    run.bench_config().write_text(ClientConfig(**cfg).model_dump_json())
    return run


def _record(run: RunDir, measured: list[int]) -> None:
    steps = [{"concurrency": c, "repeat": 0} for c in measured]
    run.slo_search.write_text(json.dumps({"ladder": LADDER, "steps": steps, "done": True}))


def _result_file(run: RunDir, c: int) -> Path:
    return run.path / ResultName(c, float("inf"), None, 1, 1).filename


def test_a_search_shows_only_the_points_it_measured(tmp_path: Path) -> None:
    run = _run(tmp_path, {"slos": {"s": {"ttft_p90": 100}}, "start": 4})
    # Before the search's record exists, the whole ladder is planned.
    assert [p.concurrency for p in planned(run)] == LADDER
    _record(run, [4, 8, 16, 8])
    # A ladder value with a result file of its own (an earlier run's, say) is shown all the same.
    _result_file(run, 1).write_text("{}")
    assert [(p.concurrency, p.verdict) for p in planned(run)] == [
        (1, "unreadable result file"),
        (4, "no result"),
        (8, "no result"),
        (16, "no result"),
    ]


def test_a_plain_sweep_plans_every_value(tmp_path: Path) -> None:
    run = _run(tmp_path, None)
    _record(run, [4])  # a stray record does not hide a plain sweep's points
    assert [p.concurrency for p in planned(run)] == LADDER


def test_an_unreadable_record_hides_nothing(tmp_path: Path) -> None:
    run = _run(tmp_path, {"slos": {"s": {"ttft_p90": 100}}, "start": 4})
    run.slo_search.write_text("{not json")
    assert [p.concurrency for p in planned(run)] == LADDER
