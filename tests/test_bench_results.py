"""Result file naming and write-once atomic writes."""

from __future__ import annotations

import json
import math

import pytest

from harness.bench.results import BenchResult, ResultExistsError, result_filename, write_result

pytestmark = pytest.mark.timeout(30)


def _result(**kw):
    fields = dict(
        date="20250101-000000", model_id="m", tokenizer_id="t", num_prompts=1, request_rate="inf",
        max_concurrency=1, range_ratio=1.0, range_ratio_convention="inferencex",
        random_input_len=8, random_output_len=8, duration=1.0, completed=1, failed=0,
        total_input_tokens=8, total_output_tokens=8, request_throughput=1.0, output_throughput=8.0,
        total_token_throughput=16.0, max_output_tokens_per_s=8.0, max_concurrent_requests=1,
        input_lens=[8], output_lens=[8], ttfts=[0.1], itls=[[0.01]], errors=[],
        **{f"{s}_{k}_ms": 1.0 for s in ("mean", "median", "std") for k in ("ttft", "tpot", "itl", "e2el")},
    )
    return BenchResult(**(fields | kw))


def test_result_filename():
    assert result_filename(4, math.inf, 1, 2) == "concurrency_4_req_rate_inf_gpus_3_ctx_1_gen_2.json"
    assert result_filename(8, 2.5, 2, 2) == "concurrency_8_req_rate_2.5_gpus_4_ctx_2_gen_2.json"
    assert result_filename(8, 4.0, 0, 1) == "concurrency_8_req_rate_4_gpus_1_ctx_0_gen_1.json"


def test_write_never_overwrites(tmp_path):
    path = tmp_path / "sub" / result_filename(1, math.inf, 1, 1)
    write_result(_result(**{"p99.9_ttft_ms": 2.0}, metadata={"run": "a"}), path)
    data = json.loads(path.read_text())
    assert data["p99.9_ttft_ms"] == 2.0 and data["metadata"] == {"run": "a"}
    assert data["request_rate"] == "inf" and data["backend"] == "openai"
    original = path.read_bytes()
    with pytest.raises(ResultExistsError, match="already exists"):
        write_result(_result(completed=99), path)
    assert path.read_bytes() == original
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
