"""dataset `mooncake_trace`: every point replays the trace's requests at its timestamps over the
speed (harness.bench.trace), the concurrency capping those in flight."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.bench.client_config import ClientConfig
from harness.bench.dataset import SampleRequest
from harness.bench.resume import TraceReplay, replay_of
from harness.bench.trace import TraceRecord, load_trace, schedule_section, synthesize
from harness.bench.trace import offsets as trace_offsets
from harness.bench.workloads.base import IndependentRequests, Sent
from harness.validity.outputs import OutputsCheck


class TraceReplayWorkload(IndependentRequests):
    def __init__(self) -> None:
        super().__init__()
        self.trace: list[TraceRecord] = []  # the requests every point replays

    def load(self, base: ClientConfig) -> None:
        assert base.trace is not None and base.dataset_path is not None  # the config's check
        self.trace = load_trace(base.dataset_path)[: base.trace.max_requests]

    def requests(self, cfg: ClientConfig, concurrency: int) -> int:
        return len(self.trace)  # each point replays the trace

    def sample(self, cfg: ClientConfig, count: int, rng: np.random.Generator) -> list[SampleRequest]:
        # Warmups and sentinels take the trace's first requests' shapes with their own seed
        # streams: blocks of their own, so they never warm the measured ones.
        assert cfg.trace is not None
        return synthesize(self._tokenizer(), self.trace[:count], cfg.trace.block_tokens, rng)

    def offsets(self, cfg: ClientConfig, count: int) -> np.ndarray:
        assert cfg.trace is not None
        return trace_offsets(self.trace[:count], cfg.trace.speed)

    def plan(self, cfg: ClientConfig, count: int) -> str:
        assert cfg.trace is not None
        offs = self.offsets(cfg, count)
        return f"the trace's {count} requests over {float(offs[-1]):.1f} s (speed {cfg.trace.speed:g})"

    def sections(
        self, cfg: ClientConfig, concurrency: int, sent: Sent, check: OutputsCheck | None, sentinels_sent: bool
    ) -> dict[str, Any]:
        assert cfg.trace is not None
        offs = self.offsets(cfg, self.requests(cfg, concurrency))
        return {"schedule": schedule_section(sent.outs, offs, cfg.trace.speed, concurrency).model_dump(mode="json")}

    def replay(self, base: ClientConfig) -> TraceReplay | None:
        return replay_of(base, self.trace)
