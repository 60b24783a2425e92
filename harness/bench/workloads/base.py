"""The workload interface: what a point sends and when, planned before its clock starts.

A workload (one module each in this package, chosen once from the config's `dataset` by the
table in __init__) reads its files before any point, samples independent requests (warm-ups,
sentinels) and plans a point's windows: independent requests with their send times
(RequestWindow: random prompts, a prompt file, a trace at its timestamps) or whole sessions
(SessionWindow: each turn built from the answer before it). A window is sent by the sweep's
load runner (harness.bench.load_runner), which owns the connections, the load processes and
the stop rules; the workload adds its own sections to the point's result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from harness.bench.client import RequestOutput
from harness.bench.client_config import ClientConfig
from harness.bench.dataset import SampleRequest
from harness.bench.loadgen import Progress
from harness.bench.resume import TraceReplay
from harness.bench.scope import ARRIVALS, WARMUP
from harness.bench.sessions import SessionRun, SessionSpec
from harness.bench.tokenizer import PromptTokenizer
from harness.validity.outputs import OutputsCheck

# A seed sub-stream of the running point -> a generator drawn from it (harness.bench.scope).
Seeds = Callable[[int], np.random.Generator]


@dataclass
class Sent:
    """A sent window: every request's output, why it stopped early (None: it ran to its end),
    and the sessions' run for a window of sessions."""

    outs: list[RequestOutput]
    stopped: str | None
    sessions: SessionRun | None = None


class Sender(Protocol):
    """What sends a window (harness.bench.load_runner.LoadRunner)."""

    async def batch(
        self,
        label: str,
        reqs: list[SampleRequest],
        concurrency: int,
        rate: float,
        point_limit: float,
        rng: np.random.Generator,
        progress: Progress | None = None,
        offsets: np.ndarray | None = None,
    ) -> tuple[list[RequestOutput], str | None]: ...

    async def session_batch(
        self,
        label: str,
        specs: list[SessionSpec],
        concurrency: int,
        point_limit: float,
        progress: Progress | None = None,
    ) -> tuple[SessionRun, str | None]: ...


class Window(Protocol):
    """One window of a point's requests, drawn already; `send` sends them."""

    @property
    def span_s(self) -> float:
        """How long its schedule lasts at least (a trace's span over its speed), added to its time bound."""
        ...

    async def send(
        self, sender: Sender, label: str, concurrency: int, limit: float, progress: Progress | None
    ) -> Sent: ...


@dataclass(frozen=True)
class RequestWindow:
    """Independent requests: sent at `offsets` (s from the window's start), else at `rate` with
    gaps drawn from `arrivals`."""

    reqs: list[SampleRequest]
    rate: float
    arrivals: np.random.Generator
    offsets: np.ndarray | None = None

    @property
    def span_s(self) -> float:
        return float(self.offsets[-1]) if self.offsets is not None else 0.0

    async def send(self, sender: Sender, label: str, concurrency: int, limit: float, progress: Progress | None) -> Sent:
        outs, stopped = await sender.batch(
            label, self.reqs, concurrency, self.rate, limit, self.arrivals, progress, self.offsets
        )
        return Sent(outs, stopped)


@dataclass(frozen=True)
class SessionWindow:
    """Whole sessions, `concurrency` of them in flight."""

    specs: list[SessionSpec]
    span_s: float = 0.0

    async def send(self, sender: Sender, label: str, concurrency: int, limit: float, progress: Progress | None) -> Sent:
        run, stopped = await sender.session_batch(label, self.specs, concurrency, limit, progress)
        return Sent(list(run.outs), stopped, run)


class Workload(Protocol):
    """What every point of a sweep sends (one per `dataset`)."""

    @property
    def in_workers(self) -> bool:
        """Whether its requests can be built ahead and sent by load processes (--workers)."""
        ...

    def load(self, base: ClientConfig) -> None:
        """Read its files, before any point (a trace's length is every point's request count)."""

    def start(self, base: ClientConfig, tokenizer: PromptTokenizer) -> None:
        """With the tokenizer loaded: what every point shares (a random prefix)."""

    def requests(self, cfg: ClientConfig, concurrency: int) -> int:
        """A point's measured requests."""
        ...

    def sample(self, cfg: ClientConfig, count: int, rng: np.random.Generator) -> list[SampleRequest]:
        """`count` independent requests of the workload's shape (sentinels; warm-ups of requests)."""
        ...

    def describe(self, cfg: ClientConfig, concurrency: int) -> str:
        """A point's plan, for the log: its warm-ups, then what its measured window sends."""
        ...

    def warmups(self, cfg: ClientConfig, concurrency: int, seeds: Seeds) -> Window:
        """The point's warm-ups (unmeasured), all at once up to the concurrency."""
        ...

    def window(self, cfg: ClientConfig, concurrency: int, seeds: Seeds, stream: int) -> Window:
        """A window of the point's measured requests, drawn from seed sub-stream `stream`."""
        ...

    def sections(
        self, cfg: ClientConfig, concurrency: int, sent: Sent, check: OutputsCheck | None, sentinels_sent: bool
    ) -> dict[str, Any]:
        """Its own sections of the point's result."""
        ...

    def replay(self, base: ClientConfig) -> TraceReplay | None:
        """What a resumed sweep checks a kept trace replay against (None: no replay)."""
        ...


class IndependentRequests:
    """What the workloads of independent requests share: warm-ups at once, a measured window
    at the request rate (or at a schedule of its own, `offsets`), sendable by load processes."""

    in_workers = True

    def __init__(self) -> None:
        self.tokenizer: PromptTokenizer | None = None

    def load(self, base: ClientConfig) -> None:
        pass

    def start(self, base: ClientConfig, tokenizer: PromptTokenizer) -> None:
        self.tokenizer = tokenizer

    def requests(self, cfg: ClientConfig, concurrency: int) -> int:
        return cfg.num_prompts_for(concurrency)

    def sample(self, cfg: ClientConfig, count: int, rng: np.random.Generator) -> list[SampleRequest]:
        raise NotImplementedError

    def offsets(self, cfg: ClientConfig, count: int) -> np.ndarray | None:
        """The measured requests' send times (s from the first); None: drawn from the rate."""
        return None

    def plan(self, cfg: ClientConfig, count: int) -> str:
        rate_text = "inf" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g}/s"
        return f"{count} requests at rate {rate_text}"

    def describe(self, cfg: ClientConfig, concurrency: int) -> str:
        plan = self.plan(cfg, self.requests(cfg, concurrency))
        return f"{cfg.num_warmups_for(concurrency)} warmups, then {plan}"

    def warmups(self, cfg: ClientConfig, concurrency: int, seeds: Seeds) -> Window:
        reqs = self.sample(cfg, cfg.num_warmups_for(concurrency), seeds(WARMUP))
        return RequestWindow(reqs, math.inf, seeds(ARRIVALS))  # the gaps are unused at rate inf

    def window(self, cfg: ClientConfig, concurrency: int, seeds: Seeds, stream: int) -> Window:
        n = self.requests(cfg, concurrency)
        # Every window of a point takes its gaps from the point's arrivals stream: the same send times.
        return RequestWindow(
            self.sample(cfg, n, seeds(stream)), cfg.request_rate, seeds(ARRIVALS), self.offsets(cfg, n)
        )

    def sections(
        self, cfg: ClientConfig, concurrency: int, sent: Sent, check: OutputsCheck | None, sentinels_sent: bool
    ) -> dict[str, Any]:
        return {}

    def replay(self, base: ClientConfig) -> TraceReplay | None:
        return None

    def _tokenizer(self) -> PromptTokenizer:
        assert self.tokenizer is not None, "start() loads the tokenizer before any point"
        return self.tokenizer
