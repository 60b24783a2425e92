"""A server's `usage` is not taken on trust: `pdbench bench` against a server (a real socket) whose
usage.completion_tokens contradicts what it streamed or what was asked for fails those requests,
each with both numbers, instead of writing a point at millions of tokens/s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bench_fake_server import FakeServer

from harness import tiny_model

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


@pytest.mark.parametrize("workers", ["1", "2"])  # in this process; in load processes
def test_a_usage_that_contradicts_the_stream_fails_its_request(model_dir: str, tmp_path: Path, workers: str) -> None:
    lies = {3: "usage_high", 5: "usage_low"}  # arrival numbers of the measured requests (no warm-ups)
    with FakeServer(lambda n, body: lies.get(n)) as srv:
        argv = ["bench", "--base-url", srv.base_url, "--model", "tiny", "--tokenizer", model_dir, "--isl", "16"]
        argv += ["--osl", "8", "--concurrency", "1", "--num-prompts", "8", "--num-warmups", "0"]
        argv += ["--results-dir", str(tmp_path / "r"), "--workers", workers, "--progress", "plain"]
        r = subprocess.run(
            [sys.executable, "-m", "harness", *argv], capture_output=True, text=True, timeout=90, cwd=REPO
        )
        # Precondition: the lies were served, to requests that asked for 8 tokens.
        assert len(srv.bodies) == 8 and {srv.bodies[i]["max_tokens"] for i in lies} == {8}
    assert r.returncode == 1, r.stdout + r.stderr
    (path,) = (tmp_path / "r").glob("*.json")
    data = json.loads(path.read_text())
    assert data["completed"] == 6 and data["failed"] == 2
    assert sorted(data["errors"]) == [
        "usage.completion_tokens 1 is fewer than the 8 content events streamed",
        "usage.completion_tokens 100000 is more than the 8 asked for (max_tokens)",
    ]
    # The lies count nowhere: every completed request's tokens are what it streamed.
    assert data["total_output_tokens"] == 6 * 8 and sorted(data["output_lens"]) == [0, 0] + [8] * 6
