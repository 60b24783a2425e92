"""Result file naming and write-once atomic writes."""

from __future__ import annotations

import json
import math

import pytest
from helpers.bench_results import bench_result

from harness.bench.results import BenchResult, ResultExistsError, write_result
from harness.rundir import ResultName

pytestmark = pytest.mark.timeout(30)


def test_write_never_overwrites(tmp_path):
    path = tmp_path / "sub" / ResultName(1, math.inf, prefill_gpus=1, decode_gpus=1).filename
    write_result(bench_result(**{"p99.9_ttft_ms": 2.0}, metadata={"run": "a"}), path)
    data = json.loads(path.read_text())
    assert data["p99.9_ttft_ms"] == 2.0 and data["metadata"] == {"run": "a"}
    assert data["request_rate"] == "inf" and data["backend"] == "openai"
    original = path.read_bytes()
    with pytest.raises(ResultExistsError, match="already exists"):
        write_result(bench_result(completed=99), path)
    assert path.read_bytes() == original
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


# The keys of a `vllm bench serve --save-result` file (vLLM 0.32, random dataset, default
# --percentile-metrics ttft,tpot,itl and --metric-percentiles 99), plus the per-request
# arrays it keeps with --save-detailed (generated_texts aside: pdbench keeps no text).
VLLM_KEYS = {
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "latencies",
    "queue_times",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "rtfx",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "std_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "std_itl_ms",
    "p99_itl_ms",
    "input_lens",
    "output_lens",
    "start_times",
    "ttfts",
    "itls",
    "errors",
}
IX_EXTRA = {"best_of", "mean_e2el_ms", "median_e2el_ms", "std_e2el_ms", "p90_e2el_ms", "p99.9_e2el_ms"}


def test_keys_are_a_superset_of_vllm_and_ix(tmp_path):
    from harness.bench.client import RequestOutput
    from harness.bench.serve_metrics import compute_metrics

    outs = []
    for itl in (0.4, 0.2):  # two TPOTs: no statistic is 0
        o = RequestOutput(prompt_len=8, expected_output_len=2)
        o.start_time, o.end_time, o.ttft, o.itl, o.latency, o.output_tokens, o.success = (
            1.0,
            1.1 + itl,
            0.1,
            [itl],
            0.1 + itl,
            2,
            True,
        )
        outs.append(o)
    fields = {k: v for k, v in bench_result().model_dump().items() if not k.endswith("_ms")}
    fields |= compute_metrics(outs, [90, 99, 99.9])
    path = write_result(BenchResult(**fields), tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data.keys() >= VLLM_KEYS | IX_EXTRA, sorted((VLLM_KEYS | IX_EXTRA) - data.keys())
    assert data["failed"] == 0 and data["request_goodput"] is None and data["stop_reason"] is None
    assert data["range_ratio_convention"] == "inferencex" and data["zero_per_token_stats"] == {}


def test_zero_tpot_statistics_move_out_of_inferencex_division(tmp_path):
    # One sample: its std is 0; no sample at all (every request failed, or one token each): all 0.
    r = bench_result(**{"std_tpot_ms": 0.0, "p99_tpot_ms": 0.0, "p99_ttft_ms": 0.0})
    data = json.loads(write_result(r, tmp_path / "r.json").read_text())
    assert data["zero_per_token_stats"] == {"std_tpot_ms": 0.0, "p99_tpot_ms": 0.0}
    assert "std_tpot_ms" not in data and data["mean_tpot_ms"] == 1.0
    assert data["p99_ttft_ms"] == 0.0  # 0 / 1000 is fine for InferenceX; only TPOT is divided by


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("p99_ttft_ms", None, "p99_ttft_ms: must be a finite number"),
        ("p99_ttft_ms", math.nan, "p99_ttft_ms: must be a finite number"),
        ("slo_ms", {"ttft": 1}, "slo_ms: must be a finite number"),
        ("p99_tpot_ms", math.inf, "p99_tpot_ms: must be a finite number"),
        ("tpot_slo", "50", "tpot_slo: must be a finite number"),
    ],
)
def test_keys_inferencex_would_choke_on_are_refused(key, value, needle):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=needle):
        bench_result(**{key: value})


def test_concurrent_writers_one_wins(tmp_path):
    import threading

    path = tmp_path / ResultName(2, math.inf, prefill_gpus=1, decode_gpus=1).filename
    wins, losses = [], []

    def write(i):
        try:
            write_result(bench_result(completed=i), path)
            wins.append(i)
        except ResultExistsError:
            losses.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(wins) == 1 and len(losses) == 7
    assert json.loads(path.read_text())["completed"] == wins[0]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
