"""`pdbench bench` without `--tokenizer` uses `--model`'s value for it, as `vllm bench serve` does
(a local model directory or an HF id names both), and says so in each result's tokenizer_id."""

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
REPO = Path(__file__).resolve().parents[2]


def test_the_tokenizer_defaults_to_the_model(tmp_path: Path) -> None:
    model = str(tiny_model.build(tmp_path / "m"))
    results = tmp_path / "r"
    with FakeServer() as srv:
        r = subprocess.run(
            [
                *(sys.executable, "-m", "harness", "bench", "--base-url", srv.base_url, "--model", model),
                *("--isl", "16", "--osl", "4", "--concurrency", "1", "--num-prompts", "4", "--num-warmups", "1"),
                *("--results-dir", str(results), "--workers", "1", "--progress", "plain"),
            ],
            capture_output=True,
            text=True,
            timeout=100,
            cwd=REPO,
            env=os.environ | {"COLUMNS": "120"},
        )
        bodies = list(srv.bodies)
    assert r.returncode == 0, r.stdout + r.stderr
    # The requests name the model as given, and the prompts were cut with its tokenizer (16 tokens).
    assert bodies and {b["model"] for b in bodies} == {model}, bodies[:1]
    (path,) = results.glob("*.json")
    data = json.loads(path.read_text())
    assert data["tokenizer_id"] == model and data["model_id"] == model, data["tokenizer_id"]
    assert data["total_input_tokens"] == 16 * data["completed"], data["total_input_tokens"]
