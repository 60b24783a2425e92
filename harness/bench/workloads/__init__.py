"""What a sweep's points send: one workload per `dataset`, behind harness.bench.workloads.base.Workload.

| dataset | module | what a point sends |
|---|---|---|
| random | random_prompts | independent prompts of exact random lengths, at the request rate |
| jsonl, sharegpt | file_prompts | independent prompts from a file, at the request rate |
| sessions | multi_turn | multi-turn sessions, each turn built from the answer before it |
| mooncake_trace | trace_replay | a trace's requests at its timestamps over the speed |

A new workload is one module here and one line in WORKLOADS.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.bench.client_config import ClientConfig
from harness.bench.workloads.base import RequestWindow, Seeds, Sender, Sent, SessionWindow, Window, Workload
from harness.bench.workloads.file_prompts import FilePrompts
from harness.bench.workloads.multi_turn import MultiTurn
from harness.bench.workloads.random_prompts import RandomPrompts
from harness.bench.workloads.trace_replay import TraceReplayWorkload

__all__ = [
    "WORKLOADS",
    "RequestWindow",
    "Seeds",
    "Sender",
    "Sent",
    "SessionWindow",
    "Window",
    "Workload",
    "workload_for",
]

WORKLOADS: dict[str, Callable[[], Workload]] = {
    "random": RandomPrompts,
    "jsonl": FilePrompts,
    "sharegpt": FilePrompts,
    "sessions": MultiTurn,
    "mooncake_trace": TraceReplayWorkload,
}


def workload_for(cfg: ClientConfig) -> Workload:
    """A fresh workload for the config's dataset (it holds what it loads: a file, a trace, a prefix)."""
    try:
        make = WORKLOADS[cfg.dataset]
    except KeyError:
        raise ValueError(f"dataset {cfg.dataset!r}: no workload for it (known: {', '.join(WORKLOADS)})") from None
    return make()
