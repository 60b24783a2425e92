"""The mock engine's /metrics: the vLLM families pdbench reads, as vLLM exposes them.

vLLM exposes its metrics with prometheus_client; so does this, from a collector over the
engine's EngineCounters (the request path only bumps integers), so the text format is the
library's, not a copy of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from harness.mock_engine.counters import FINISH_REASONS, PROMPT_SOURCES, EngineCounters

# (name without _total, help, its count): vLLM's own names and help texts.
COUNTERS: tuple[tuple[str, str, Callable[[EngineCounters], int]], ...] = (
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", lambda c: c.prompt_tokens),
    ("vllm:generation_tokens", "Number of generation tokens processed.", lambda c: c.generation_tokens),
    (
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        lambda c: c.prefix_cache_queries,
    ),
    (
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        lambda c: c.prefix_cache_hits,
    ),
    (
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, in tokens.",
        lambda c: c.external_prefix_cache_queries,
    ),
    (
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, in tokens.",
        lambda c: c.external_prefix_cache_hits,
    ),
)


class EngineMetrics:
    """A prometheus_client collector over one engine's counters, labelled with its model."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, counters: EngineCounters, model: str) -> None:
        self.counters, self.model = counters, model
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        counts = self.counters
        names, values = ["engine", "model_name"], ["0", self.model]
        for name, help_text, count in COUNTERS:
            c = CounterMetricFamily(name, help_text, labels=names)
            c.add_metric(values, float(count(counts)))
            yield c
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", labels=[*names, "source"]
        )
        for source in PROMPT_SOURCES:
            by_source.add_metric([*values, source], float(counts.prompt_by_source[source]))
        yield by_source
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*names, "finished_reason"]
        )
        for reason in FINISH_REASONS:
            success.add_metric([*values, reason], float(counts.success[reason]))
        yield success
        for name, help_text, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", counts.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", 0),
        ):
            g = GaugeMetricFamily(name, help_text, labels=names)
            g.add_metric(values, float(value))
            yield g
