"""Resuming a trace replay (dataset mooncake_trace): a finished point is kept, as every point
replays the whole trace (its request count is the trace's, not the concurrency's); a point made
with another trace or at another speed is not."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.bench_configs import sweep_config
from helpers.bench_fake_server import FakeServer
from helpers.bench_results import bench_result

from harness import tiny_model
from harness.bench import run_sweep_detailed
from harness.bench.resume import replay_of, why_not_kept
from harness.bench.trace import load_trace, offsets
from harness.rundir import ResultName

pytestmark = pytest.mark.timeout(120)
FIXTURE = Path(__file__).parents[1] / "fixtures" / "traces" / "sessions-small.jsonl"
RECIPE = "dsr1-fp8-mi355x-moriio-1p2d"  # renders without a model or vLLM here (--skip-flag-check)


def _submit(results: Path, trace: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "harness", "submit", "--recipe", RECIPE, "--dry-run", "--skip-flag-check"]
    sets = ["benchmark.dataset=mooncake_trace", f"benchmark.dataset_path={trace}", "benchmark.concurrency=[1,2]"]
    argv += ["--results-dir", str(results), *(w for s in sets for w in ("--set", s)), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _finished(run: Path, concurrency: int, trace: Path, requests: int) -> None:
    """A complete, valid result of this trace point at speed 1, as the job's client writes it."""
    span = round(float(offsets(load_trace(trace), 1.0)[-1]), 6)
    schedule = {"requests": requests, "sent": requests, "speed": 1.0, "span_s": span, "cap": concurrency}
    schedule |= {"in_flight_max": 1, "cap_delayed": 0, "lateness_ms": None, "client_lateness_ms": None}
    result = bench_result(
        model_id="deepseek-r1-0528-fp8",
        max_concurrency=concurrency,
        num_prompts=requests,
        completed=requests,
        random_input_len=8192,
        random_output_len=1024,
        dataset_name="mooncake_trace",
        dataset_path=str(trace),
        schedule=schedule,
    )
    path = run / ResultName(concurrency, float("inf"), prefill_gpus=8, decode_gpus=16).filename
    path.write_text(result.model_dump_json())


def test_submit_resume_keeps_finished_trace_points(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    shutil.copy(FIXTURE, trace)
    requests = len(load_trace(trace))
    results = tmp_path / "results"
    assert _submit(results, trace).returncode == 0
    (old,) = (results / RECIPE).iterdir()
    bench = json.loads((old / "bench.json").read_text())
    # The precondition: the recipe's request count per concurrency is not the trace's.
    assert bench["min_prompts"] == 16 and bench["prompts_multiplier"] == 10 and requests == 18
    for c in (1, 2):
        _finished(old, c, trace, requests)

    r = _submit(results, trace, "--resume", str(old))
    assert r.returncode == 0, r.stderr
    assert "the sweep reuses 2 and measures 0 of its 2 point(s)" in r.stdout, r.stdout
    assert "nothing to measure: every point of the sweep is kept; nothing submitted" in r.stdout

    # Another trace at the same path, as many requests at other times: both are measured again.
    lines = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    trace.write_text("".join(json.dumps(r | {"timestamp": 2 * r["timestamp"]}) + "\n" for r in lines))
    r = _submit(results, trace, "--resume", str(old))
    assert r.returncode == 0, r.stderr
    assert "the sweep reuses 0 and measures 2 of its 2 point(s)" in r.stdout, r.stdout
    assert "trace span 4.692 s (now 9.384 s)" in r.stdout, r.stdout
    # Another trace at the same path, fewer requests: both are measured again.
    trace.write_text("".join(FIXTURE.read_text().splitlines(keepends=True)[:12]))
    r = _submit(results, trace, "--resume", str(old))
    assert r.returncode == 0, r.stderr
    assert "the sweep reuses 0 and measures 2 of its 2 point(s)" in r.stdout, r.stdout
    assert "num_prompts 18 (now 12)" in r.stdout
    # Another speed measures something else: the resume is refused, naming the key.
    r = _submit(results, trace, "--set", "benchmark.trace.speed=2", "--resume", str(old))
    assert r.returncode == 2 and "recipe.benchmark.trace.speed: 1.0 then, 2.0 now" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


def test_bench_resume_keeps_a_trace_point_of_the_same_trace_and_speed(model_dir, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    shutil.copy(FIXTURE, trace)
    out = tmp_path / "out"
    kw = dict(dataset="mooncake_trace", dataset_path=str(trace), num_prompts=None, num_warmups=1)
    kw |= dict(trace={"speed": 4.0, "max_requests": 8, "block_tokens": 16})
    with FakeServer() as srv:
        first = run_sweep_detailed(sweep_config(model_dir, out, srv.base_url, **kw))
    assert [(o.ok, o.kept) for o in first] == [(True, False), (True, False)]
    # The precondition: a trace point's request count is the trace's (8), not the config's for C.
    cfg = sweep_config(model_dir, out, srv.base_url, **kw)
    assert {json.loads(o.path.read_text())["num_prompts"] for o in first} == {8} != {cfg.num_prompts_for(2)}

    with FakeServer() as srv:
        second = run_sweep_detailed(sweep_config(model_dir, out, srv.base_url, resume=True, **kw))
        assert srv.bodies == []  # nothing was sent again
    assert [(o.ok, o.kept) for o in second] == [(True, True), (True, True)]

    # What resume judges a point by: the same trace at the same speed keeps it; another speed, or
    # another trace of as many requests (elsewhere, or at the same path), does not.
    records = load_trace(trace)[:8]
    point = first[1].path

    def why(sent=records, **change) -> str | None:
        return why_not_kept(point, 32, 6, 2, 8, "tiny", trace=replay_of(cfg.model_copy(update=change), sent))

    assert why() is None
    assert why(trace=cfg.trace.model_copy(update={"speed": 2.0})) == (
        "made with other settings: trace speed 4.0 (now 2.0), trace span 0.20125 s (now 0.4025 s)"
    )
    other = tmp_path / "other.jsonl"
    shutil.copy(trace, other)
    assert why(dataset_path=str(other)) == (
        f"made with other settings: dataset_path {str(trace)!r} (now {str(other)!r})"
    )
    slower = [replace(r, timestamp_ms=r.timestamp_ms * 2) for r in records]
    assert why(slower) == "made with other settings: trace span 0.20125 s (now 0.4025 s)"


def test_bench_resume_runs_a_trace_point_of_another_speed_again(model_dir, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    shutil.copy(FIXTURE, trace)
    out = tmp_path / "out"
    kw = dict(dataset="mooncake_trace", dataset_path=str(trace), num_prompts=None, num_warmups=0, concurrency=[2])
    with FakeServer() as srv:
        (first,) = run_sweep_detailed(
            sweep_config(model_dir, out, srv.base_url, trace={"speed": 4.0, "max_requests": 4}, **kw)
        )
    assert first.ok and json.loads(first.path.read_text())["schedule"]["speed"] == 4.0
    with FakeServer() as srv:
        (again,) = run_sweep_detailed(
            sweep_config(model_dir, out, srv.base_url, trace={"speed": 8.0, "max_requests": 4}, resume=True, **kw)
        )
        assert len(srv.bodies) == 4  # the trace's requests, sent again
    assert again.ok and not again.kept
    assert json.loads(again.path.read_text())["schedule"]["speed"] == 8.0
    (moved,) = (out / "superseded").iterdir()
    assert json.loads(moved.read_text())["schedule"]["speed"] == 4.0  # set aside, not overwritten
