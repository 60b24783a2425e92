"""The mock engine's counters and their /metrics rendering, without an engine or a server."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from harness.mock_engine.counters import EngineCounters
from harness.mock_engine.exposition import EngineMetrics


def _samples(metrics: EngineMetrics) -> dict[tuple[str, str], float]:
    """(sample name, its source or finished_reason label, "" when none) -> value, model label checked."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            assert s.labels["engine"] == "0" and s.labels["model_name"] == "tiny", s
            out[(s.name, s.labels.get("source") or s.labels.get("finished_reason") or "")] = s.value
    return out


def test_metrics_render_the_counters_they_are_given() -> None:
    counters = EngineCounters()
    metrics = EngineMetrics(counters, "tiny")
    before = _samples(metrics)
    assert before[("vllm:prompt_tokens_total", "")] == 0 and before[("vllm:num_requests_running", "")] == 0

    counters.admitted(10, 4)  # a decode leg whose KV came over the connector for 4 of its 10 prompt tokens
    counters.finished(3, "stop")
    counters.admitted(2, 0)
    counters.aborted()
    counters.admitted(5, 0)  # still running
    after = _samples(metrics)

    assert after[("vllm:prompt_tokens_total", "")] == 17
    assert after[("vllm:prefix_cache_queries_total", "")] == 17
    assert after[("vllm:prefix_cache_hits_total", "")] == 0
    assert after[("vllm:external_prefix_cache_queries_total", "")] == 17
    assert after[("vllm:external_prefix_cache_hits_total", "")] == 4
    assert after[("vllm:generation_tokens_total", "")] == 3
    assert {k[1]: v for k, v in after.items() if k[0] == "vllm:prompt_tokens_by_source_total"} == {
        "local_compute": 13,
        "local_cache_hit": 0,
        "external_kv_transfer": 4,
    }
    assert {k[1]: v for k, v in after.items() if k[0] == "vllm:request_success_total"} == {
        "length": 0,
        "stop": 1,
        "abort": 1,
    }
    assert after[("vllm:num_requests_running", "")] == 1
    assert after[("vllm:num_requests_waiting", "")] == 0
