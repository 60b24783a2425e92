"""pdbench's one Prometheus text parser (harness.validity.series) reads what prometheus_client's
reads: every series of the recorded scrapes and of the forms vLLM writes (HELP and TYPE lines,
histograms, +Inf buckets, timestamps, NaN), with the same names, labels and values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.validity.series import Scrape

FIXTURES = sorted((Path(__file__).parents[1] / "fixtures" / "metrics").rglob("*.prom"))
FORMS = """# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 1.25
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3 1764400000000
vllm:kv_cache_usage_perc{engine="1",model_name="m"} NaN
process_open_fds 35.0
"""


def _library(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    )


def _ours(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return sorted((s.name, s.labels, s.value) for s in Scrape.parse(text).series)


@pytest.mark.parametrize("path", FIXTURES, ids=[f"{p.parent.name}/{p.name}" for p in FIXTURES])
def test_a_recorded_scrape_reads_as_the_library_reads_it(path: Path) -> None:
    text = path.read_text()
    ours = _ours(text)
    assert len(ours) > 10 and ours == _library(text)


def test_the_forms_vllm_writes_read_as_the_library_reads_them() -> None:
    ours, theirs = _ours(FORMS), _library(FORMS)
    nan = [i for i, s in enumerate(ours) if math.isnan(s[2])]
    assert len(ours) == 7 and nan == [i for i, s in enumerate(theirs) if math.isnan(s[2])] == [5]
    assert [s for i, s in enumerate(ours) if i not in nan] == [s for i, s in enumerate(theirs) if i not in nan]
