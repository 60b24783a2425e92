"""What each KV connector's servers export that proves a transfer, as read in vLLM 0.32's code.

Every connector, through vLLM's scheduler (`v1/core/sched/scheduler.py`, `v1/metrics/loggers.py`):
`vllm:external_prefix_cache_hits` counts the prompt tokens a connector said it would load,
recorded when decode admits the request, and `vllm:prompt_tokens_by_source{source="local_compute"}`
the prompt tokens decode computed itself. Together they say decode did not prefill; they do not
say that a load completed. Only a connector's own counters say that, and the connectors differ:

- NIXL (`nixl/stats.py`, `NixlPromMetrics`): decode pulls, so decode observes
  `vllm:nixl_xfer_time_seconds` once per completed read; `vllm:nixl_num_failed_transfers`,
  `vllm:nixl_num_failed_notifications`, and on prefill `vllm:nixl_num_kv_expired_reqs`,
  `vllm:nixl_num_notifications_after_expiry`.
- The bundled connector (`connector/stats.py`): `vllm:pdbench_kv_recv_seconds` once per completed
  pull on decode; `vllm:pdbench_kv_failed_recv`, `_failed_send`, `_expired` (counters).
- Mooncake (`mooncake/stats.py`): `MooncakeKVConnectorStats` records transfers and failures, but
  vLLM 0.32 has no `build_prom_metrics` for it ("TODO(mooncake-stats)"): nothing reaches /metrics.
- MoRI-IO (`moriio/moriio_connector.py`): no connector stats at all.

So for Mooncake and MoRI-IO the KV rule rests on the scheduler's counters alone; with vLLM's
default `kv_load_failure_policy: fail` a failed load fails its request, which the failed-requests
rule catches, while `recompute` would hide it. The rule's detail says so on every point.
This module is the one place these facts live; `docs/validity.md` lists them per connector.
"""

from __future__ import annotations

from dataclasses import dataclass

# Counters are matched by their exposed `_total` series (never `_created`, which holds a time).
# Counted by vLLM's scheduler for any connector: (family pattern, labels).
EXTERNAL_HITS = [
    (r"vllm:external_prefix_cache_hits(_total)?", {}),
    (r"vllm:prompt_tokens_cached_by_source(_total)?", {"source": "p2p"}),
]
LOCAL_COMPUTE = (r"vllm:prompt_tokens_by_source(_total)?", {"source": "local_compute"})


@dataclass(frozen=True)
class KvEvidence:
    """One connector's transfer counters (family-name patterns, full match); None: not exported."""

    connector: str
    received: str | None  # on decode: one count per completed KV receive
    failures: str | None  # failed transfers, notifications or receives (either role)
    expired: str | None  # KV held by prefill that expired unread (either role)
    missing: str = ""  # what the connector does not export, for the rules' details


_NIXL_FAIL = r"vllm:nixl_num_failed_(transfers|notifications)_total"
_NIXL_EXPIRED = r"vllm:nixl_num_(kv_expired_reqs|notifications_after_expiry)_total"
_PDBENCH_FAIL = r"vllm:pdbench_kv_failed_(recv|send)_total"
_PDBENCH_EXPIRED = r"vllm:pdbench_kv_expired_total"
_NO_PROM = "vLLM 0.32 exports no {} transfer counters to /metrics"

CONNECTORS: dict[str, KvEvidence] = {
    "nixl": KvEvidence("nixl", r"vllm:nixl_xfer_time_seconds_count", _NIXL_FAIL, _NIXL_EXPIRED),
    "pdbench": KvEvidence("pdbench", r"vllm:pdbench_kv_recv_seconds_count", _PDBENCH_FAIL, _PDBENCH_EXPIRED),
    "mooncake": KvEvidence(
        "mooncake", None, None, None, _NO_PROM.format("Mooncake") + " (its stats have no build_prom_metrics)"
    ),
    "moriio": KvEvidence("moriio", None, None, None, _NO_PROM.format("MoRI-IO") + " (it keeps no connector stats)"),
}

# A deployment whose connector pdbench was not told (`pdbench bench` against any server): any
# family that looks like a connector's failure, expiry or receive counter.
GENERIC = KvEvidence(
    "unknown",
    None,
    r"(vllm:)?\w*(nixl|moriio|mooncake|pdbench|kv_transfer|kv_connector)\w*(failed|failure|error)\w*_total",
    r"(vllm:)?\w*(nixl|moriio|mooncake|pdbench|kv)\w*(expired|after_expiry)\w*_total",
    "the connector is not known (no kv_connector given), so no completed-transfer counter is looked for",
)


def evidence_for(connector: str | None) -> KvEvidence:
    """The connector's evidence; raises ValueError naming the known ones for an unknown name."""
    if connector is None:
        return GENERIC
    try:
        return CONNECTORS[connector]
    except KeyError:
        raise ValueError(f"unknown KV connector {connector!r}; known: {', '.join(sorted(CONNECTORS))}") from None
