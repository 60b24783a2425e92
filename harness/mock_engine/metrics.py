"""The mock engine's /metrics: the vLLM families pdbench reads, as vLLM exposes them.

vLLM exposes its metrics with prometheus_client; so does this, from a collector over the
engine's plain counters (the request path only bumps integers), so the text format is the
library's, not a copy of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from harness.mock_engine.app import Engine

# (name without _total, help): vLLM's own names and help texts.
COUNTERS = (
    ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "Number of generation tokens processed."),
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    (
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, in tokens.",
    ),
    (
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, in tokens.",
    ),
)
COUNTER_NAMES = tuple(f"{name}_total" for name, _ in COUNTERS)
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISH_REASONS = ("length", "stop", "abort")


class EngineMetrics:
    """A prometheus_client collector over one engine's counters."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        names, values = ["engine", "model_name"], ["0", e.cfg.model]
        for name, help_text in COUNTERS:
            c = CounterMetricFamily(name, help_text, labels=names)
            c.add_metric(values, float(e.counters[f"{name}_total"]))
            yield c
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", labels=[*names, "source"]
        )
        for source in PROMPT_SOURCES:
            by_source.add_metric([*values, source], float(e.prompt_by_source[source]))
        yield by_source
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*names, "finished_reason"]
        )
        for reason in FINISH_REASONS:
            success.add_metric([*values, reason], float(e.success[reason]))
        yield success
        for name, help_text, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", e.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", 0),
        ):
            g = GaugeMetricFamily(name, help_text, labels=names)
            g.add_metric(values, float(value))
            yield g
