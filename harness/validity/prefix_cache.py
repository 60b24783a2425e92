"""The `prefix_cache` section and its informational rule, from each server's /metrics around a point.

Counter names as read in vLLM 0.32 (v1/metrics/loggers.py): vllm:prefix_cache_queries/hits (the
instance's own cache, in tokens), vllm:external_prefix_cache_queries/hits (the KV connector's),
vllm:request_success (finished requests) and vllm:cache_config_info{enable_prefix_caching}.
The rule never fails a point: a hit rate is what the workload shared, not a fault; it says so
beside the verdict, so a user sees whether the workload shared what it claims to.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.rundir.prefix_cache_summary import CacheCounts, CacheRole, InstanceCache, PrefixCacheSummary
from harness.validity.rules import PREFIX_HITS, PointValidity, RuleResult, ServerScrapes
from harness.validity.series import Scrape, delta

RULE = "prefix_cache"
QUERIES = r"vllm:prefix_cache_queries(_total)?"
HITS = PREFIX_HITS
EXTERNAL_QUERIES = r"vllm:external_prefix_cache_queries(_total)?"
EXTERNAL_HITS = r"vllm:external_prefix_cache_hits(_total)?"
REQUESTS = r"vllm:request_success(_total)?"
CONFIG_INFO = r"vllm:cache_config_info"
RUNNING = r"vllm:num_requests_running"
_ROLES: tuple[CacheRole, ...] = ("prefill", "decode", "aggregated")


def _rate(hits: float | None, queries: float | None) -> float | None:
    return hits / queries if hits is not None and queries else None


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _total(scrape: Scrape, pattern: str) -> float | None:
    t = scrape.total(pattern)
    return None if t is None else t[0]


def _enabled(text: str) -> bool | None:
    flags = {s.label("enable_prefix_caching") for s in Scrape.parse(text).find(CONFIG_INFO)} - {None}
    if not flags:
        return None
    return "False" not in flags


def _window(b: Scrape, a: Scrape, pattern: str) -> float | None:
    """A counter's end minus start; None when not exported, or when it went down (the server
    restarted during the point, so the window's count is unknown)."""
    v = delta(b, a, pattern)
    return None if v is None or v[0] < 0 else v[0]


def _counts(b: Scrape, a: Scrape) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, queries, hits in (("", QUERIES, HITS), ("external_", EXTERNAL_QUERIES, EXTERNAL_HITS)):
        q, h = _window(b, a, queries), _window(b, a, hits)
        if q is not None and h is not None and h > q:  # not one consistent window: say nothing
            q = h = None
        out[f"{key}queries"], out[f"{key}hits"] = q, h
    return out


def _with_rates(c: Mapping[str, float | None]) -> dict[str, float | None]:
    return {
        **c,
        "hit_rate": _rate(c["hits"], c["queries"]),
        "external_hit_rate": _rate(c["external_hits"], c["external_queries"]),
    }


def summarize(servers: Mapping[str, ServerScrapes], urls: Mapping[str, str]) -> PrefixCacheSummary:
    """`servers`: scrape target name -> its scrapes (the proxy's are skipped); `urls`: name -> base URL."""
    instances: list[InstanceCache] = []
    enabled: list[bool] = []
    exported = False
    for name, s in servers.items():
        if s.role not in _ROLES:
            continue
        b, a = Scrape.parse(s.before), Scrape.parse(s.after)
        exported = exported or a.total(QUERIES) is not None
        req = _window(b, a, REQUESTS)
        running = max(
            [v for v in (s.peaks.get("running"), *(_total(x, RUNNING) for x in (b, a))) if v is not None],
            default=None,
        )
        on = _enabled(s.after or s.before)
        if on is not None:
            enabled.append(on)
        instances.append(
            InstanceCache(
                name=name,
                role=s.role,
                url=urls.get(name, ""),
                requests=req,
                peak_running=running,
                **_with_rates(_counts(b, a)),
            )
        )
    roles: dict[CacheRole, CacheCounts] = {}
    for role in _ROLES:
        group = [i for i in instances if i.role == role]
        if group:
            keys = ("queries", "hits", "external_queries", "external_hits")
            summed = {k: _sum([getattr(i, k) for i in group]) for k in keys}
            roles[role] = CacheCounts(**_with_rates(summed))
    on = all(enabled) if enabled else None  # off where any instance says off
    text = _text(on, roles, instances, exported)
    return PrefixCacheSummary(enabled=on, roles=roles, instances=instances, text=text)


def _pct(rate: float | None) -> str:
    return "no lookups" if rate is None else f"{rate:.1%}"


def _text(
    enabled: bool | None, roles: Mapping[CacheRole, CacheCounts], instances: list[InstanceCache], exported: bool
) -> str:
    if not exported:
        return "no counters: no server exports vllm:prefix_cache_queries"
    if all(c.queries is None for c in roles.values()):
        return "counts unknown: the servers' prefix-cache counters went down during the point (a restart)"
    if enabled is False:
        return "prefix caching off (vllm:cache_config_info enable_prefix_caching=False)"
    parts = []
    for role, c in roles.items():
        if c.queries is None:
            parts.append(f"{role}: no counters")
            continue
        part = f"hit rate {_pct(c.hit_rate)} on {role} ({c.hits or 0:.0f} of {c.queries:.0f} tokens)"
        per = [i for i in instances if i.role == role]
        if len(per) > 1:
            part += " [" + ", ".join(f"{i.name} {_pct(i.hit_rate)}" for i in per) + "]"
        if role == "decode" and c.external_hits:
            part += f"; decode loaded {c.external_hits:.0f} tokens from prefill (external hits, not cache hits)"
        parts.append(part)
    return "prefix caching on, " + "; ".join(parts)


def rule(summary: PrefixCacheSummary) -> RuleResult:
    """Informational: 'passed' with the hit rate of the first role that looked anything up (prefill
    in PD) where counters exist, else 'not_checked'. Never 'failed': a hit rate is what the workload
    shared, not a fault of the deployment."""
    if all(c.queries is None for c in summary.roles.values()):
        return RuleResult(name=RULE, status="not_checked", detail=summary.text)
    rates = [c.hit_rate for c in summary.roles.values() if c.hit_rate is not None]
    return RuleResult(name=RULE, status="passed", measured=rates[0] if rates else None, detail=summary.text)


def with_prefix_cache(verdict: PointValidity, summary: PrefixCacheSummary) -> PointValidity:
    """The point's verdict with the prefix_cache rule added; the verdict itself is unchanged."""
    return verdict.model_copy(update={"rules": [*verdict.rules, rule(summary)]})
