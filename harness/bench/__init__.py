"""Minimal streaming benchmark client for OpenAI-compatible (vLLM) endpoints.

Produces one JSON per concurrency point with `vllm bench serve` metric names, so
results from pdbench and from vLLM's own client can be compared directly.
"""

from __future__ import annotations

from typing import Any

from harness.bench.config import BenchConfig

__all__ = ["BenchConfig", "PointOutcome", "run_sweep", "run_sweep_detailed"]


def __getattr__(name: str) -> Any:
    # Lazy: the sweep pulls in transformers, which the CLI should not pay for on --help.
    if name in ("PointOutcome", "run_sweep", "run_sweep_detailed"):
        from harness.bench import sweep

        return getattr(sweep, name)
    raise AttributeError(name)
