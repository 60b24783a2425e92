"""A complete, valid BenchResult whose fields a test overrides."""

from __future__ import annotations

from harness.bench.results import BenchResult


def bench_result(**kw):
    fields = dict(
        date="20250101-000000",
        model_id="m",
        tokenizer_id="t",
        num_prompts=1,
        request_rate="inf",
        max_concurrency=1,
        range_ratio=1.0,
        range_ratio_convention="inferencex",
        random_input_len=8,
        random_output_len=8,
        duration=1.0,
        completed=1,
        failed=0,
        total_input_tokens=8,
        total_output_tokens=8,
        request_throughput=1.0,
        output_throughput=8.0,
        total_token_throughput=16.0,
        max_output_tokens_per_s=8.0,
        max_concurrent_requests=1,
        input_lens=[8],
        output_lens=[8],
        ttfts=[0.1],
        itls=[[0.01]],
        errors=[],
        **{f"{s}_{k}_ms": 1.0 for s in ("mean", "median", "std") for k in ("ttft", "tpot", "itl", "e2el")},
    )
    return BenchResult(**(fields | kw))
