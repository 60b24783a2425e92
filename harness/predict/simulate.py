"""A discrete-event simulation of one deployment under a closed-loop load: C clients, each sending
its next request when the last one finished, as `pdbench bench` drives a point.

The model, per request: proxy and client time (overhead), then the prefill queue of its instance
(round-robin over the prefill workers), the prompt's compute, the KV hand-off (with `kv_polled`
not begun while its prefill instance computes the next batch), then the decode instance's queue
and its continuous batch until the last token. A prefill instance is a batch server:
it takes the waiting prompts in arrival order up to `max_num_seqs` prompts and `max_batched_tokens`
tokens and computes them in `prefill(tokens)` (the intercept paid once per batch). A decode instance
runs steps of `decode_step(B)` for its B running sequences (at most `max_num_seqs`; the rest wait),
one token per sequence per step; a sequence that arrives during a step joins at the next one. An
aggregated instance does both in one step, as vLLM's scheduler does: the step's admitted prompts
are computed with the running batch's decode and delay it, so prefill stalls decode there.

Instances that share their devices (CPU servers pinned to one core) share them as processors do:
`prefill_groups` / `decode_groups` name each instance's group, and k instances of a group busy at
once each progress at 1/k of their speed (processor sharing), so an idle neighbour costs nothing and
a busy one halves a batch's speed while both run.

Service times are the profile's fits; with `jitter` each one is drawn around its fit with the fit's
residual spread (seeded), which spreads the percentiles as the measured noise does. As the client
does, the clients start at once and send `requests` requests in all (the point's num_prompts), all
of them measured, the start's burst included. The run is bounded by `max_events` events; a run that
hits the bound says so (`truncated`).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SimConfig:
    phase: str  # disagg | agg
    concurrency: int
    isl: int
    osl: int
    prefill_workers: int
    decode_workers: int  # 0 for agg
    prefill_ms: Callable[[int], float]  # batch's prompt tokens -> ms
    decode_step_ms: Callable[[int], float]  # running batch -> ms per step
    kv_ms: float = 0.0
    # The hand-off progresses only when the prefill instance polls between its batches (NIXL
    # without its progress thread, connector.progress_thread: false): a batch whose instance
    # starts the next one at once hands off when that one ends.
    kv_polled: bool = False
    overhead_ms: float = 0.0
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    prefill_jitter_ms: float = 0.0  # sd of a prefill batch's time around its fit
    step_jitter_ms: float = 0.0  # sd of a decode step's time around its fit
    requests: int = 0  # requests sent, as the point's num_prompts; 0: max(64, 8 * concurrency)
    # Each instance's device group (instances of a group share its devices); () : one group each.
    prefill_groups: tuple[int, ...] = ()
    decode_groups: tuple[int, ...] = ()
    warmup_per_client: int = 0  # each client's first requests, left out of the figures
    seed: int = 0
    max_events: int = 2_000_000


@dataclass
class SimResult:
    ttft_ms: list[float]
    tpot_ms: list[float]
    duration_s: float
    output_tokens: int
    truncated: bool
    # Sequences decoding alongside a request on its instance, itself included, over its decode
    # (first to last token), averaged over the requests: the measure the profile's decode line is
    # fitted against (seen_batch), taken the same way from the simulated requests.
    mean_decode_batch: float

    def percentile(self, what: str, q: float) -> float:
        xs = self.ttft_ms if what == "ttft" else self.tpot_ms
        return float(np.percentile(xs, q)) if xs else float("nan")

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0


@dataclass
class _Req:
    rid: int
    client: int
    start: float
    first: float = -1.0
    last: float = -1.0
    left: int = 0  # tokens still to emit
    measured: bool = True
    decoder: int = -1  # the decode (or aggregated) instance it decoded on


@dataclass
class _Instance:
    waiting: deque[_Req] = field(default_factory=deque)
    running: list[_Req] = field(default_factory=list)
    busy: bool = False
    group: int = 0
    work_ms: float = 0.0  # what is left of the current service at full speed
    rate: float = 1.0  # its share of the group's devices
    since: float = 0.0  # when work_ms and rate were last set
    version: int = 0  # its scheduled end's stamp: a re-planned end makes the old event stale
    kind: str = ""  # the event that ends its work
    payload: object = None
    held: list[_Req] = field(default_factory=list)  # its last batch, waiting to hand off (kv_polled)


class _Sim:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.events: list[tuple[float, int, str, int, object]] = []
        self.seq = itertools.count()
        self.rids = itertools.count()
        agg = cfg.phase == "agg"
        self.prefill = _pool(cfg.prefill_workers, cfg.prefill_groups)
        self.decode = self.prefill if agg else _pool(cfg.decode_workers, cfg.decode_groups)
        self.rr_p = itertools.cycle(range(len(self.prefill)))
        self.rr_d = itertools.cycle(range(len(self.decode)))
        self.sent = [0] * cfg.concurrency
        self.target = cfg.requests or max(64, 8 * cfg.concurrency)
        self.total_sent = 0
        self.done: list[_Req] = []
        self.finishes: list[float] = []  # the measured requests' finish times

    def at(self, t: float, kind: str, where: int, obj: object = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, where, obj))

    def draw(self, mean: float, sd: float) -> float:
        return max(0.0, self.rng.gauss(mean, sd)) if sd > 0 else mean

    def send(self, t: float, client: int) -> None:
        r = _Req(next(self.rids), client, t, left=self.cfg.osl)
        r.measured = self.sent[client] >= self.cfg.warmup_per_client
        self.sent[client] += 1
        self.total_sent += 1
        self.at(t + self.cfg.overhead_ms / 1000.0, "prefill_arrive", next(self.rr_p), r)

    def _admit(self, inst: _Instance, limit_tokens: bool) -> list[_Req]:
        """The waiting requests this step takes, in arrival order, within the batch's limits."""
        cfg, tokens = self.cfg, 0
        out: list[_Req] = []
        room = cfg.max_num_seqs - len(inst.running)
        while inst.waiting and len(out) < room:
            if limit_tokens and out and tokens + cfg.isl > cfg.max_batched_tokens:
                break
            out.append(inst.waiting.popleft())
            tokens += cfg.isl
        return out

    def start_prefill(self, t: float, i: int) -> None:
        """A disaggregated prefill instance: one batch of waiting prompts."""
        inst = self.prefill[i]
        if inst.busy or not inst.waiting:
            return
        cfg = self.cfg
        batch = self._admit(inst, limit_tokens=True)
        tokens = len(batch) * cfg.isl
        self.serve(self.prefill, i, t, self.draw(cfg.prefill_ms(tokens), cfg.prefill_jitter_ms), "prefill_done", batch)

    def start_step(self, t: float, i: int) -> None:
        """A decode (or aggregated) instance's next step over its running batch."""
        inst = self.decode[i]
        if inst.busy:
            return
        cfg = self.cfg
        agg = cfg.phase == "agg"
        new = self._admit(inst, limit_tokens=agg)
        if not new and not inst.running:
            return
        dt = 0.0
        if agg and new:
            dt += self.draw(cfg.prefill_ms(len(new) * cfg.isl), cfg.prefill_jitter_ms)
        decoding = len(inst.running) + (0 if agg else len(new))
        if decoding:
            dt += self.draw(cfg.decode_step_ms(decoding), cfg.step_jitter_ms)
        for r in new:
            r.decoder = i
        inst.running.extend(new)
        self.serve(self.decode, i, t, dt, "step_done", None)

    def serve(self, pool: list[_Instance], i: int, t: float, ms: float, kind: str, payload: object) -> None:
        """Instance i starts `ms` of work at full speed; its group's shares are re-planned."""
        inst = pool[i]
        self._progress(pool, inst.group, t)
        inst.busy, inst.work_ms, inst.payload, inst.kind = True, ms, payload, kind
        self._replan(pool, inst.group, t)

    def release(self, pool: list[_Instance], i: int, t: float) -> None:
        """Instance i's work is done: the others of its group get its share."""
        inst = pool[i]
        self._progress(pool, inst.group, t)
        inst.busy, inst.work_ms = False, 0.0
        self._replan(pool, inst.group, t)

    def _progress(self, pool: list[_Instance], group: int, t: float) -> None:
        for inst in pool:
            if inst.group == group and inst.busy:
                inst.work_ms = max(0.0, inst.work_ms - (t - inst.since) * 1000.0 * inst.rate)
                inst.since = t

    def _replan(self, pool: list[_Instance], group: int, t: float) -> None:
        busy = [(i, inst) for i, inst in enumerate(pool) if inst.group == group and inst.busy]
        for i, inst in busy:
            inst.rate, inst.since, inst.version = 1.0 / len(busy), t, inst.version + 1
            self.at(t + inst.work_ms / 1000.0 / inst.rate, inst.kind, i, (inst.version, inst.payload))

    def hand_off(self, t: float, i: int, batch: list[_Req]) -> None:
        """Prefill instance i ended `batch`: the KV hand-off of it (and of the batch it held, if
        any) begins. Polled, the instance's next batch starting at once holds it until its end:
        the transfer progresses only when the engine polls, between its steps (a 1P1D on the
        local cluster at C=2 shows it: requests 12 ms apart both took 67-69 ms to the first
        token where one alone takes 38-47, the first one's hand-off waiting out the second's
        prefill)."""
        inst, cfg = self.prefill[i], self.cfg
        ready, inst.held = inst.held, []
        if cfg.kv_polled and inst.waiting:
            inst.held = batch
        else:
            ready = ready + batch
        for r in ready:
            self.at(t + cfg.kv_ms / 1000.0, "decode_arrive", next(self.rr_d), r)

    def step_done(self, t: float, i: int) -> None:
        inst = self.decode[i]
        self.release(self.decode, i, t)
        still: list[_Req] = []
        for r in inst.running:
            if r.first < 0:
                r.first = t  # its first token: an aggregated prompt's step, or decode's first step
            r.left -= 1
            if r.left <= 0:
                self.finish(t, r)
            else:
                still.append(r)
        inst.running = still
        self.start_step(t, i)

    def finish(self, t: float, r: _Req) -> None:
        r.last = t
        if r.measured:
            self.done.append(r)
            self.finishes.append(t)
        if self.total_sent < self.target:
            self.send(t, r.client)

    def run(self) -> SimResult:
        cfg = self.cfg
        for c in range(min(cfg.concurrency, self.target)):
            self.send(0.0, c)
        n = 0
        t = 0.0
        while self.events and n < cfg.max_events:
            t, _, kind, i, obj = heapq.heappop(self.events)
            n += 1
            if kind in ("prefill_done", "step_done"):
                stamp: int
                stamp, obj = obj  # type: ignore[misc]
                pool = self.prefill if kind == "prefill_done" else self.decode
                if stamp != pool[i].version:
                    continue  # re-planned since: a later event ends this work
            if kind == "prefill_arrive":
                if cfg.phase == "agg":
                    self.decode[i].waiting.append(obj)  # type: ignore[arg-type]
                    self.start_step(t, i)
                else:
                    self.prefill[i].waiting.append(obj)  # type: ignore[arg-type]
                    self.start_prefill(t, i)
            elif kind == "prefill_done":
                self.release(self.prefill, i, t)
                self.hand_off(t, i, obj)  # type: ignore[arg-type]
                self.start_prefill(t, i)
            elif kind == "decode_arrive":
                self.decode[i].waiting.append(obj)  # type: ignore[arg-type]
                self.start_step(t, i)
            else:
                self.step_done(t, i)
        # Throughput as the client reports it: the measured tokens over the time from the first
        # measured request's start to the last finish (the clients' ramp included).
        f = self.finishes
        span = f[-1] - min(r.start for r in self.done) if f else 0.0
        # Per instance: a request decodes alongside its own instance's sequences only.
        seen = []
        for i in range(len(self.decode)):
            on = [(r.first, r.last) for r in self.done if r.decoder == i]
            b = seen_batch(on)
            if b is not None:
                seen.append((b, len(on)))
        batch = sum(b * n for b, n in seen) / sum(n for _, n in seen) if seen else 0.0
        return SimResult(
            ttft_ms=[(r.first - r.start) * 1000.0 for r in self.done],
            tpot_ms=[(r.last - r.first) * 1000.0 / (cfg.osl - 1) for r in self.done if cfg.osl > 1],
            duration_s=span,
            output_tokens=len(f) * cfg.osl,
            truncated=n >= cfg.max_events,
            mean_decode_batch=batch,
        )


def seen_batch(intervals: Sequence[tuple[float, float]]) -> float | None:
    """The sequences decoding alongside a request, itself included, over its decode (its first to
    its last token), averaged over the requests: the batch its decode steps ran at, whose step time
    its TPOT measures. Not the time average of the batch (Little's law, requests/s x time
    decoding): that counts the time no request decodes, so below a saturating load it is well
    under the batch the steps ran at (a 1P1D job at C=8 decoded 7.3 sequences a step while the
    time average was 3.9). None where no request decoded over a positive time."""
    iv = np.array([(a, b) for a, b in intervals if b > a], dtype=float).reshape(-1, 2)
    if not len(iv):
        return None
    # N(t), the requests decoding at t, is a step function; its integral F is piecewise linear.
    edges = np.concatenate([iv[:, 0], iv[:, 1]])
    steps = np.concatenate([np.ones(len(iv)), -np.ones(len(iv))])
    order = np.argsort(edges, kind="stable")
    t, n = edges[order], np.cumsum(steps[order])
    area = np.concatenate([[0.0], np.cumsum(n[:-1] * np.diff(t))])
    inside = np.interp(iv[:, 1], t, area) - np.interp(iv[:, 0], t, area)
    return float(np.mean(inside / (iv[:, 1] - iv[:, 0])))


def _pool(n: int, groups: tuple[int, ...]) -> list[_Instance]:
    if groups and len(groups) != n:
        raise ValueError(f"{len(groups)} device groups for {n} instances")
    return [_Instance(group=groups[i] if groups else i) for i in range(n)]


def simulate(cfg: SimConfig) -> SimResult:
    if cfg.concurrency < 1 or cfg.isl < 1 or cfg.osl < 1 or cfg.prefill_workers < 1:
        raise ValueError("concurrency, isl, osl and prefill workers must be at least 1")
    if cfg.phase == "disagg" and cfg.decode_workers < 1:
        raise ValueError("a disaggregated deployment needs at least one decode worker")
    return _Sim(cfg).run()
