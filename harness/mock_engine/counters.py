"""What one mock engine has counted: the numbers its /metrics exports, and nothing else.

The request path only bumps integers here; harness.mock_engine.exposition renders them in
vLLM's names. This module knows neither the engine nor the HTTP side.
"""

from __future__ import annotations

# vllm:prompt_tokens_by_source's sources and vllm:request_success's finished_reason values.
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISH_REASONS = ("length", "stop", "abort")


class EngineCounters:
    """Totals since the engine started, and the requests in flight."""

    __slots__ = (
        "external_prefix_cache_hits",
        "external_prefix_cache_queries",
        "generation_tokens",
        "prefix_cache_hits",
        "prefix_cache_queries",
        "prompt_by_source",
        "prompt_tokens",
        "running",
        "success",
    )

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0  # the mock has no local prefix cache: stays 0
        self.external_prefix_cache_queries = 0
        self.external_prefix_cache_hits = 0
        # What decode computed itself against what it loaded over the KV connector.
        self.prompt_by_source = dict.fromkeys(PROMPT_SOURCES, 0)
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.running = 0

    def admitted(self, prompt_tokens: int, external_hits: int) -> None:
        """A request was accepted; `external_hits` of its prompt tokens came over the KV connector."""
        self.prompt_tokens += prompt_tokens
        self.prefix_cache_queries += prompt_tokens
        self.external_prefix_cache_queries += prompt_tokens
        self.external_prefix_cache_hits += external_hits
        self.prompt_by_source["external_kv_transfer"] += external_hits
        self.prompt_by_source["local_compute"] += prompt_tokens - external_hits
        self.running += 1

    def finished(self, generated: int, reason: str) -> None:
        """An admitted request sent all its `generated` tokens and ended for `reason` ("length", "stop")."""
        self.running -= 1
        self.generation_tokens += generated
        self.success[reason] += 1

    def aborted(self) -> None:
        """An admitted request ended early (the client went away, a write failed)."""
        self.running -= 1
        self.success["abort"] += 1
