"""`pdbench bench`: a streaming benchmark client for OpenAI-compatible (vLLM) endpoints.

One JSON per concurrency point, a superset of `vllm bench serve`'s result keys, so
results from pdbench and from vLLM's own client can be compared directly.

Modules: config (ClientConfig), dataset (random exact-length prompts, shared prefix,
JSONL/ShareGPT files), client (keep-alive HTTP/1.1 streaming over asyncio protocols,
SSE parsing), loadgen (arrivals, concurrency slots, stop), watchdog (target health
and server PIDs), metrics (vLLM's definitions), results (pydantic model, write-once
files), progress (rich bar or plain lines), sweep (points in order), cli.
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
