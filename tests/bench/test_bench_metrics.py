"""Metric formulas on hand-made timing samples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.bench.client import RequestOutput
from harness.bench.serve_metrics import compute_metrics, percentile_label

pytestmark = pytest.mark.timeout(30)


def _out(start, ttft, itl, tokens, prompt_len=10, error=""):
    o = RequestOutput(prompt_len=prompt_len, expected_output_len=tokens)
    o.start_time, o.ttft, o.itl, o.output_tokens = start, ttft, list(itl), tokens
    o.latency = ttft + sum(itl)
    o.end_time = start + o.latency
    o.success, o.error = not error, error
    if error:
        o.output_tokens = 0
    return o


def test_percentile_label():
    assert [percentile_label(p) for p in (50, 90.0, 99.9, 99.99)] == ["50", "90", "99.9", "99.99"]


def test_metrics_formulas():
    a = _out(0.0, 0.1, [0.02, 0.03, 0.05], 4)  # latency 0.2, tpot 0.1/3
    b = _out(0.5, 0.3, [0.1], 5)  # usage says 5 tokens over 2 chunks: tpot 0.1/4
    c = _out(1.0, 0.2, [], 1)  # single token: no tpot
    d = _out(0.2, 0.0, [], 0, error="HTTP 500 Internal Server Error: boom")
    d.end_time = 2.0  # failed requests still bound the duration
    m = compute_metrics([a, b, c, d], [50, 99, 99.9])

    assert m["completed"] == 3 and m["failed"] == 1
    assert m["errors"] == ["HTTP 500 Internal Server Error: boom"]
    assert m["duration"] == pytest.approx(2.0)
    assert m["output_lens"] == [4, 5, 1, 0]
    assert m["total_output_tokens"] == 10 and m["total_input_tokens"] == 30
    assert m["output_throughput"] == pytest.approx(5.0)
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["total_token_throughput"] == pytest.approx(20.0)
    assert m["request_goodput"] is None

    tpots = np.array([0.1 / 3, 0.1 / 4]) * 1000
    assert m["mean_tpot_ms"] == pytest.approx(tpots.mean())
    assert m["std_tpot_ms"] == pytest.approx(abs(tpots[0] - tpots[1]) / 2)  # population std
    ttfts = np.array([100.0, 300.0, 200.0])
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx(math.sqrt(((ttfts - 200) ** 2).mean()))
    assert m["p50_ttft_ms"] == pytest.approx(200.0)
    assert m["p99.9_ttft_ms"] == pytest.approx(np.percentile(ttfts, 99.9))
    assert m["p99_e2el_ms"] == pytest.approx(np.percentile([200.0, 400.0, 200.0], 99))
    assert m["mean_itl_ms"] == pytest.approx(np.mean([20, 30, 50, 100]))
    assert {
        f"{s}_{k}_ms" for s in ("mean", "median", "std", "p50", "p99", "p99.9") for k in ("ttft", "tpot", "itl", "e2el")
    } <= m.keys()
    # Chunks per 1 s bucket from the first send: a(4) + b(2) in [0,1), c(1) in [1,2).
    assert m["max_output_tokens_per_s"] == 6.0
    assert m["max_concurrent_requests"] == 1  # a ends at 0.2, b spans 0.5-0.9, c 1.0-1.2


def test_metrics_all_failed_is_zero_not_nan():
    m = compute_metrics([_out(0.0, 0, [], 0, error="x")], [99])
    assert m["completed"] == 0 and m["failed"] == 1
    assert m["mean_ttft_ms"] == 0.0 and m["p99_itl_ms"] == 0.0 and m["max_output_tokens_per_s"] == 0.0


def test_goodput_against_slos_by_hand():
    # ttft, tpot, e2el (ms): a 100, 33.3, 200; b 300, 25, 400; c 200, (one token: 0), 200.
    a = _out(0.0, 0.1, [0.02, 0.03, 0.05], 4)
    b = _out(0.5, 0.3, [0.1], 5)
    c = _out(1.0, 0.2, [], 1)
    d = _out(0.2, 0.0, [], 0, error="x")  # a failed request is never good
    d.end_time = 2.0  # duration 2 s
    cases = [
        ({"ttft": 200}, 2),  # a, c (200 <= 200 passes, as vLLM's >=)
        ({"ttft": 199.999}, 1),
        ({"tpot": 30}, 2),  # b (25) and c (one token counts as tpot 0)
        ({"tpot": 30, "e2el": 300}, 1),  # c only
        ({"e2el": 1000, "ttft": 1000, "tpot": 1000}, 3),
        ({"ttft": 0}, 0),
    ]
    for slos, good in cases:
        assert compute_metrics([a, b, c, d], [99], slos)["request_goodput"] == pytest.approx(good / 2.0), slos


def test_per_request_arrays_and_peaks_by_hand():
    a = _out(10.0, 0.1, [0.2, 0.2], 3)  # tokens at 10.1, 10.3, 10.5; ends 10.5
    b = _out(10.2, 0.1, [0.1], 2)  # tokens at 10.3, 10.4; ends 10.4
    c = _out(10.5, 0.6, [0.1], 2)  # starts when a ends: not concurrent with it; tokens 11.1, 11.2
    u = RequestOutput(prompt_len=10, expected_output_len=3)
    u.error = "point timeout"  # never sent: no start time
    a.queue_time, b.queue_time = 0.0, 0.25
    m = compute_metrics([a, b, c, u], [50])
    assert m["start_times"][:3] == pytest.approx([0.0, 0.2, 0.5]) and m["start_times"][3] is None
    assert m["latencies"] == pytest.approx([0.5, 0.2, 0.7, 0.0])
    assert m["queue_times"] == [0.0, 0.25, 0.0, 0.0]
    assert m["duration"] == pytest.approx(1.2)  # 10.0 .. c's end at 11.2
    assert m["max_concurrent_requests"] == 2  # a+b overlap; c starts as a ends
    assert m["max_output_tokens_per_s"] == 5.0  # [10,11): a 3 + b 2; [11,12): c 2
    # The request never sent is neither completed nor failed, nor among the errors.
    assert m["output_lens"] == [3, 2, 2, 0] and (m["completed"], m["failed"], m["not_sent"]) == (3, 0, 1)
    assert m["errors"] == []
    assert m["median_e2el_ms"] == pytest.approx(500.0) and m["p50_itl_ms"] == pytest.approx(150.0)  # 100, 100, 200, 200
    assert m["mean_tpot_ms"] == pytest.approx(np.mean([200.0, 100.0, 100.0]))
