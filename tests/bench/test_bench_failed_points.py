"""A point that measured nothing says so: with a wrong model every warm-up fails and `pdbench bench`
stops before its measured requests, naming the model and the server's answer; a point where every
measured request failed is invalid, its latencies n/a (not 0.0) in the result and in the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bench_fake_server import FakeServer

from harness import tiny_model

pytestmark = pytest.mark.timeout(120)

NO_LATENCIES = "n/a: no measured request completed"  # harness.bench.results.NO_LATENCIES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "harness", *argv], capture_output=True, text=True, timeout=90, cwd=REPO, env=env
    )


def _bench(model_dir: str, url: str, result_dir: Path, model: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return _run(
        "bench",
        *("--base-url", url, "--model", model, "--tokenizer", model_dir, "--isl", "16", "--osl", "8"),
        *("--num-prompts", "8", "--results-dir", str(result_dir), "--workers", "1", "--progress", "plain"),
        *flags,
    )


def test_a_wrong_model_stops_before_the_measured_requests(model_dir: str, tmp_path: Path) -> None:
    with FakeServer(lambda n, body: "404" if body["model"] != "tiny" else None) as srv:
        r = _bench(model_dir, srv.base_url, tmp_path / "r", "no-such-model", "--concurrency", "2,4")
        sent = len(srv.bodies)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr
    assert "C=2: every warm-up request failed, so no measured request was sent" in err, err
    assert f"model 'no-such-model' at {srv.base_url}" in err and "HTTP 404" in err, err
    assert "The model `no-such-model` does not exist." in err and "the points left were not run" in err, err
    # Only C=2's 4 warm-ups went out: no measured request, no C=4, no result file.
    assert sent == 4
    assert not list((tmp_path / "r").glob("*.json")) and "Traceback" not in err


def test_a_point_where_every_request_failed_is_invalid_with_no_latencies(model_dir: str, tmp_path: Path) -> None:
    results = tmp_path / "r"
    with FakeServer(lambda n, body: "500") as srv:
        r = _bench(model_dir, srv.base_url, results, "tiny", "--concurrency", "1", "--num-warmups", "0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "latencies n/a (no request completed)" in r.stdout + r.stderr
    (path,) = results.glob("*.json")
    data = json.loads(path.read_text())
    assert data["completed"] == 0 and data["failed"] == 8
    # n/a, not vLLM's 0.0: no latency statistic is in the file, and it says why.
    assert not [k for k in data if k.endswith("_ms") and any(m in k for m in ("ttft", "tpot", "itl", "e2el"))]
    assert data["latency_stats"] == NO_LATENCIES
    md = data["metadata"]
    assert md["valid"] is False and md["validity"]["verdict"] == "invalid"
    assert md["validity"]["reasons"][0].startswith("requests_completed: none of the 8 measured requests completed")
    assert data.get("bottleneck") is None

    rep = _run("report", str(results))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    # The Results table (markdown: not a terminal): latencies n/a, the point invalid.
    lines = rep.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| Run | ISL"))
    head, row = lines[at], lines[at + 2]
    cells = dict(zip(_cells(head), _cells(row), strict=True))
    for col in ("TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "E2EL p50 (ms)", "E2EL p99 (ms)"):
        assert cells[col] == "n/a", (col, row)
    assert "INVALID" in cells["Valid"] and cells["Failed"] == "8", row
    assert "requests_completed: none of the 8 measured requests completed: HTTP 500" in rep.stdout


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]
