"""Which counters prove a KV transfer, as read in vLLM 0.32's code.

Every connector, through vLLM's scheduler (`v1/core/sched/scheduler.py`, `v1/metrics/loggers.py`):
`vllm:external_prefix_cache_hits` counts the prompt tokens a connector said it would load,
recorded when decode admits the request, and `vllm:prompt_tokens_by_source{source="local_compute"}`
the prompt tokens decode computed itself. Together they say decode did not prefill; they do not
say that a load completed. Only a connector's own counters say that, and the connectors differ:
each connector's entry (harness/kv_connectors/<name>.py, `evidence`) names its counters, or says
what it does not export.

Where a connector exports none (Mooncake, MoRI-IO in vLLM 0.32) the KV rule rests on the
scheduler's counters alone; with vLLM's default `kv_load_failure_policy: fail` a failed load
fails its request, which the failed-requests rule catches, while `recompute` would hide it. The
rule's detail says so on every point. `docs/validity.md` lists the facts per connector.
"""

from __future__ import annotations

from harness import kv_connectors
from harness.kv_connectors.entry import KvEvidence

# Counters are matched by their exposed `_total` series (never `_created`, which holds a time).
# Counted by vLLM's scheduler for any connector: (family pattern, labels).
EXTERNAL_HITS = [
    (r"vllm:external_prefix_cache_hits(_total)?", {}),
    (r"vllm:prompt_tokens_cached_by_source(_total)?", {"source": "p2p"}),
]
LOCAL_COMPUTE = (r"vllm:prompt_tokens_by_source(_total)?", {"source": "local_compute"})

_ANY = "|".join(kv_connectors.kv_names())
# A deployment whose connector pdbench was not told (`pdbench bench` against any server): any
# family that looks like a connector's failure, expiry or receive counter.
GENERIC = KvEvidence(
    "unknown",
    None,
    rf"(vllm:)?\w*({_ANY}|kv_transfer|kv_connector)\w*(failed|failure|error)\w*_total",
    rf"(vllm:)?\w*({_ANY}|kv)\w*(expired|after_expiry)\w*_total",
    "the connector is not known (no kv_connector given), so no completed-transfer counter is looked for",
)


def evidence_for(connector: str | None) -> KvEvidence:
    """The connector's evidence; raises ValueError naming the known ones for an unknown name."""
    if connector is None:
        return GENERIC
    evidence = kv_connectors.get_kv(connector).evidence
    assert evidence is not None  # every connector that moves KV says what it exports
    return evidence
