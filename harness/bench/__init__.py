"""`pdbench bench`: a streaming benchmark client for OpenAI-compatible (vLLM) endpoints.

One JSON per concurrency point, a superset of `vllm bench serve`'s result keys, so
results from pdbench and from vLLM's own client can be compared directly.

Modules: client_config (ClientConfig), dataset (random exact-length prompts, shared prefix,
JSONL/ShareGPT files), sessions (multi-turn conversations: turn k re-sends the conversation so
far), trace and trace_gen (Mooncake-format traces: replay with real shared blocks, generation),
client (keep-alive HTTP/1.1 streaming over asyncio protocols, SSE parsing), loadgen (arrivals
on a send clock, concurrency slots, stop), workers (several load processes), sentinels (greedy
prompts checked against a reference), watchdog (target health and server PIDs), serve_metrics
(vLLM's definitions), validity_probe (/metrics around each point), results (pydantic model,
write-once files), progress (rich bar or plain lines), external (aiperf and `vllm bench serve`
as the job's client), slo_ladder (the SLO search's next point and its repeats, pure) and
slo_record (each point judged against the SLOs, slo_search.json), cli.

The sweep is a pipeline (docs/architecture.md, "The sweep"): scope (a point's shape, repeat and
seeds), workloads (what a point sends, one module per dataset), stops (the stop rules),
load_runner (sends and times a window), points (the points and what a resume keeps),
sweep_sentinels, point_runner (one point, warm-ups to file), slo_driver (the SLO ladder over
points) and sweep (the composition).
"""

from __future__ import annotations

from typing import Any

from harness.bench.client_config import ClientConfig

__all__ = ["ClientConfig", "PointOutcome", "run_sweep", "run_sweep_detailed"]


def __getattr__(name: str) -> Any:
    # Lazy: the sweep pulls in transformers, which the CLI should not pay for on --help.
    if name in ("PointOutcome", "run_sweep", "run_sweep_detailed"):
        from harness.bench import sweep

        return getattr(sweep, name)
    raise AttributeError(name)
