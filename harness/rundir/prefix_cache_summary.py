"""A result's `prefix_cache` section: what each server's prefix cache found over one point, from
vLLM's /metrics counters (end minus start of the point). Written by the bench client's probe
(harness.validity.prefix_cache), read by report; this model is the one definition of the format.

Token counts, as vLLM counts them at admission (v1/core/sched/scheduler.py):
- `queries`/`hits`: the instance's own (local) prefix cache, vllm:prefix_cache_queries/hits. On a
  decode instance of a PD deployment a hit is KV decode already held (an earlier turn of the same
  session, or a shared prefix, that came to this instance), so decode loads only the rest.
- `external_queries`/`external_hits`: what the KV connector was asked for and supplied,
  vllm:external_prefix_cache_queries/hits; vLLM asks the connector for the tokens not found
  locally. On decode the hits are the prompt tokens loaded from prefill (every request's KV, not
  a cache effect); on prefill they stay 0.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, model_validator

CacheRole = Literal["prefill", "decode", "aggregated"]


class CacheCounts(BaseModel):
    """None: the server(s) export no such counter."""

    model_config = ConfigDict(frozen=True)
    queries: NonNegativeFloat | None  # prompt tokens looked up in the local prefix cache
    hits: NonNegativeFloat | None  # of them, found there
    hit_rate: float | None  # hits / queries; None without queries
    external_queries: NonNegativeFloat | None  # tokens asked of the KV connector
    external_hits: NonNegativeFloat | None  # of them, supplied by it (decode: loaded from prefill)
    external_hit_rate: float | None

    @model_validator(mode="after")
    def _hits_within_queries(self) -> CacheCounts:
        for what, hits, queries in (
            ("hits", self.hits, self.queries),
            ("external_hits", self.external_hits, self.external_queries),
        ):
            if hits is not None and queries is not None and hits > queries:
                raise ValueError(f"{what} {hits:g} exceed their queries {queries:g}")
        for what, rate in (("hit_rate", self.hit_rate), ("external_hit_rate", self.external_hit_rate)):
            if rate is not None and not 0 <= rate <= 1:
                raise ValueError(f"{what} {rate} is not within [0, 1]")
        return self


class InstanceCache(CacheCounts):
    """One server (scrape target): its cache counts and its load over the point."""

    name: str  # the scrape target's name, e.g. decode-1
    role: CacheRole
    url: str
    requests: NonNegativeFloat | None  # requests it finished (vllm:request_success)
    # Most requests running at once in the point's samples (every 2 s, and its two scrapes):
    # prefill's one-token legs are often never caught running; the proxy's /metrics has the
    # exact legs in flight per instance (pdbench_proxy_backend_outstanding_peak).
    peak_running: NonNegativeFloat | None


class PrefixCacheSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    # vllm:cache_config_info's enable_prefix_caching: True on every instance that says, False if
    # one says off; None: no instance exports it.
    enabled: bool | None
    roles: dict[CacheRole, CacheCounts]  # the role's instances summed
    instances: list[InstanceCache]
    text: str  # the validity rule's detail: "prefix caching on, hit rate ..."
