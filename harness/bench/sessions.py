"""Multi-turn sessions (dataset `sessions`): each session a chain of turns whose prompt is the whole
conversation so far (every earlier prompt and the answer the server actually returned) plus new
user text, so a later turn shares most of its prompt with the one before it.

Before the clock starts (plan_sessions, seeded): each session's first prompt (isl tokens, exact,
as dataset.sample_requests makes it), the new user text of every later turn (user_tokens, exact,
without special tokens: it continues a prompt), every turn's output length and the think times
between turns. While the point runs (SessionRun), `concurrency` slots each run one session at a
time, turn after turn on its own keep-alive connection (a Slot that keeps the answer's text), so
the concurrency counts sessions in flight; a session whose turn fails sends no more turns.

A turn's prompt tokens as the server sees them (count_prompts, after the batch, off the clock):
completions, the tokenizer's count of the concatenated text (special tokens included, as
dataset.py counts); chat, the server's usage.prompt_tokens (the chat template adds tokens the
client's tokenizer cannot count), else the messages' contents counted as one prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.bench.client import Slot, Target, TextOutput, build_payload
from harness.bench.dataset import (
    Convention,
    SampleRequest,
    exact_length_prompt,
    length_bounds,
    sample_requests,
)
from harness.bench.loadgen import Progress, run_workers
from harness.bench.serve_metrics import tpot
from harness.bench.tokenizer import PromptTokenizer
from harness.config.benchmark import THINK_TIME_CAP, SessionSettings
from harness.rundir.session_header import SESSION_HEADER
from harness.rundir.session_summary import SessionSummary, Stats, ThinkTime, TurnStats


@dataclass(frozen=True)
class SessionSpec:
    """One session, drawn before the clock starts."""

    first: SampleRequest  # turn 1's prompt and output length
    user_texts: tuple[str, ...]  # turns 2, 3, ...: the new user text each adds
    output_lens: tuple[int, ...]  # every turn's max_tokens, turn 1 first
    think_s: tuple[float, ...]  # the pause after turn k's answer, before turn k + 1

    @property
    def turns(self) -> int:
        return len(self.output_lens)


def think_times(settings: SessionSettings, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` think times (s) from the configured distribution and mean."""
    mean = settings.think_time_s
    if mean == 0 or settings.think_time_distribution == "constant":
        return np.full(count, mean)
    if settings.think_time_distribution == "uniform":
        return rng.uniform(0.0, 2 * mean, size=count)
    return np.minimum(rng.exponential(mean, size=count), THINK_TIME_CAP * mean)


def plan_sessions(
    tokenizer: PromptTokenizer,
    count: int,
    isl: int,
    osl: int,
    settings: SessionSettings,
    range_ratio: float,
    convention: Convention,
    rng: np.random.Generator,
    prefix: str = "",
    prefix_len: int = 0,
) -> list[SessionSpec]:
    """`count` sessions of `settings.turns` turns. Turn 1 is a random prompt of isl tokens (after the
    shared `prefix`, as sample_requests); each later turn adds user_tokens (default isl) of new text;
    lengths are spread by range_ratio as the random dataset's are."""
    turns = settings.turns
    firsts = sample_requests(tokenizer, count, isl, osl, range_ratio, convention, rng, prefix, prefix_len)
    user_lo, user_hi = length_bounds(settings.user_tokens or isl, range_ratio, convention)
    out_lo, out_hi = length_bounds(osl, range_ratio, convention)
    user_lens = rng.integers(user_lo, user_hi + 1, size=(count, turns - 1))
    later_outs = rng.integers(out_lo, out_hi + 1, size=(count, turns - 1))
    thinks = think_times(settings, count * (turns - 1), rng).reshape(count, turns - 1)
    allowed = tokenizer.allowed_ids()
    return [
        SessionSpec(
            first=first,
            # Each starts with a word token's space, so it does not merge into the answer before it.
            user_texts=tuple(exact_length_prompt(tokenizer, int(n), allowed, rng) for n in user_lens[s]),
            output_lens=(first.output_len, *(int(n) for n in later_outs[s])),
            think_s=tuple(float(t) for t in thinks[s]),
        )
        for s, first in enumerate(firsts)
    ]


# Completions: an answer goes on a new line after its prompt. The line break keeps the prompt's
# last word a token of its own (byte-level BPE never merges across it), so the next turn's prompt
# begins with exactly the tokens of this one, as a prefix cache needs; glued on, an answer that
# begins with letters would merge into that word and change the prompt's last cache block.
ANSWER_SEPARATOR = "\n"


@dataclass
class Conversation:
    """A session's conversation so far: the prompt of its next turn is built from it."""

    spec: SessionSpec
    chat: bool
    text: str = ""  # completions: the last prompt sent and, once answered, its answer
    cuts: list[int] = field(default_factory=list)  # completions: each sent turn's prompt is text[:cut]
    messages: list[dict[str, str]] = field(default_factory=list)  # chat

    def prompt(self, turn: int) -> str | list[dict[str, str]]:
        """Turn `turn` (1-based)'s prompt, appending its new user text to the conversation."""
        new = self.spec.first.prompt if turn == 1 else self.spec.user_texts[turn - 2]
        if self.chat:
            self.messages.append({"role": "user", "content": new})
            return list(self.messages)
        self.text += new
        self.cuts.append(len(self.text))
        return self.text

    def answered(self, answer: str) -> None:
        if self.chat:
            self.messages.append({"role": "assistant", "content": answer})
        else:
            self.text += ANSWER_SEPARATOR + answer


class SessionRun:
    """One batch of sessions over `concurrency` slots: stop, drain and the time bound as LoadRun's
    (harness.bench.loadgen), with think-time pauses where LoadRun waits for arrival times.
    `outs` holds every turn of every session, session by session (index s * turns + k - 1)."""

    def __init__(
        self,
        target: Target,
        endpoint: str,
        model: str,
        ignore_eos: bool,
        specs: Sequence[SessionSpec],
        concurrency: int,
        request_timeout_s: float,
        progress: Progress,
        slots: Sequence[Slot],
        key: str,
        header: Callable[[int], dict[str, str] | None] = lambda i: None,
        sampling: dict[str, float | int] | None = None,
    ) -> None:
        """`slots`: keep_text connections, at least `concurrency` of them (the caller closes them);
        `key`: this batch's own name, which no other batch of the run has: session s's requests
        carry SESSION_HEADER `key`-s (the proxy's session policy keeps them on the same instances);
        `header(i)`: more headers of request i (the proxy's timing id)."""
        self.target, self.endpoint, self.model, self.ignore_eos = target, endpoint, model, ignore_eos
        self.sampling = sampling
        self.chat = endpoint == "chat"
        self.specs = specs
        self.turns = specs[0].turns if specs else 0
        self.outs = [TextOutput(0, n) for spec in specs for n in spec.output_lens]
        self.conversations = [Conversation(spec, self.chat) for spec in specs]
        self.concurrency = max(1, min(concurrency, len(specs))) if specs else 0
        if len(slots) < self.concurrency:
            raise ValueError(f"{len(slots)} slots for {self.concurrency} sessions in flight")
        self.slots = list(slots[: self.concurrency])
        self.request_timeout_s = request_timeout_s
        self.key = key
        self.header = header
        self.progress = progress
        progress.total = len(self.outs)
        self.stop_reason: str | None = None
        self.drain_reason: str | None = None
        self._next = 0
        self._thinking: set[asyncio.Task[None]] = set()
        self._grace: asyncio.TimerHandle | None = None
        self._stopped = asyncio.Event()

    def _halted(self) -> bool:
        return self.stop_reason is not None or self.drain_reason is not None

    async def _worker(self, slot: Slot) -> None:
        me = asyncio.current_task()
        assert me is not None
        turns, progress, outs = self.turns, self.progress, self.outs
        while not self._halted():
            s = self._next
            if s >= len(self.specs):
                return
            self._next = s + 1
            conv = self.conversations[s]
            for k in range(1, turns + 1):
                if self._halted():
                    return
                if k > 1 and (pause := conv.spec.think_s[k - 2]) > 0:
                    self._thinking.add(me)
                    try:
                        await asyncio.sleep(pause)
                    except asyncio.CancelledError:
                        if not self._halted():
                            raise
                        return  # woken by a drain or a stop: no more turns
                    finally:
                        self._thinking.discard(me)
                if self._halted():
                    return
                i = s * turns + k - 1
                body = build_payload(
                    self.endpoint,
                    self.model,
                    conv.prompt(k),
                    conv.spec.output_lens[k - 1],
                    self.ignore_eos,
                    self.sampling,
                )
                headers = {SESSION_HEADER: f"{self.key}-{s}"} | (self.header(i) or {})
                request = self.target.request_bytes(body, headers)
                out = outs[i]
                progress.sent += 1
                await slot.send(request, out, self.request_timeout_s)
                progress.done += 1
                if not out.success:
                    progress.failed += 1
                    if not self._halted():  # else run() gives the turns left the batch's reason
                        for later in range(k + 1, turns + 1):
                            outs[s * turns + later - 1].error = f"not sent: turn {k} of its session failed"
                    break
                conv.answered(out.text)

    async def run(self, limit_s: float | None = None, limit_reason: str | None = None) -> str | None:
        """Run every session; returns None, or why the batch stopped early (then every turn not
        answered fails with that reason, unless it already has its own)."""
        tasks = [asyncio.create_task(self._worker(s)) for s in self.slots]
        if tasks:
            try:
                await run_workers(
                    tasks,
                    self._stopped,
                    limit_s,
                    lambda: self.stop(limit_reason or f"point timeout: unfinished after {limit_s:g}s"),
                )
            finally:
                if self._grace is not None:
                    self._grace.cancel()
        reason = self.drain_reason or self.stop_reason
        if reason is not None:
            for o in self.outs:
                if not o.success and not o.error:
                    o.error = reason
        return reason

    def drain(self, reason: str, grace_s: float) -> None:
        """No more turns; those in flight may finish for `grace_s`, then the batch is stopped."""
        if self._halted():
            return
        self.drain_reason = reason
        for t in list(self._thinking):
            t.cancel()
        self._grace = asyncio.get_running_loop().call_later(
            grace_s, self.stop, f"{reason}: still in flight after the {grace_s:g} s grace, cancelled"
        )

    def stop(self, reason: str) -> None:
        """End the batch now; safe to call at any time, more than once."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        for s in self.slots:
            s.abort(reason)
        for t in list(self._thinking):
            t.cancel()
        self._stopped.set()


def count_prompts(tokenizer: PromptTokenizer, run: SessionRun) -> None:
    """Each sent turn's prompt tokens as the server sees them, into its prompt_len (see the module's
    docstring); after the batch, as an encode of a long conversation takes milliseconds."""
    for s, conv in enumerate(run.conversations):
        outs = run.outs[s * run.turns : (s + 1) * run.turns]
        if run.chat:
            for k, out in enumerate(outs):
                if out.start_time is None:
                    break
                if out.server_prompt_tokens is not None:
                    out.prompt_len = out.server_prompt_tokens
                else:
                    contents = [m["content"] for m in conv.messages[: 2 * k + 1]]
                    out.prompt_len = tokenizer.count("".join(contents))
        else:
            for cut, out in zip(conv.cuts, outs, strict=False):
                out.prompt_len = tokenizer.count(conv.text[:cut])


def _stats(values: Sequence[float], scale: float = 1.0) -> Stats:
    if not values:
        return Stats(mean=None, p50=None, p90=None, p99=None)
    a = np.asarray(values, dtype=float) * scale
    p50, p90, p99 = (round(float(x), 3) for x in np.percentile(a, [50, 90, 99]))
    return Stats(mean=round(float(a.mean()), 3), p50=p50, p90=p90, p99=p99)


def session_summary(run: SessionRun, settings: SessionSettings, sentinels: str) -> SessionSummary:
    """The point's `sessions` section from its measured sessions' turns."""
    turns = run.turns
    by_session = [run.outs[s * turns : (s + 1) * turns] for s in range(len(run.specs))]
    started = [outs for outs in by_session if outs[0].start_time is not None]
    complete = [outs for outs in started if all(o.success for o in outs)]
    by_turn = []
    for k in range(turns):
        sent = [outs[k] for outs in started if outs[k].start_time is not None]
        ok = [o for o in sent if o.success]
        tpots = [t for o in ok if (t := tpot(o)) is not None]
        by_turn.append(
            TurnStats(
                turn=k + 1,
                requests=len(sent),
                completed=len(ok),
                ttft_ms=_stats([o.ttft for o in ok], 1000.0),
                tpot_ms=_stats(tpots, 1000.0),
                prompt_tokens_mean=round(sum(o.prompt_len for o in sent) / len(sent), 1) if sent else None,
            )
        )
    durations = [
        outs[-1].end_time - outs[0].start_time  # type: ignore[operator]  # complete: sent and ended
        for outs in complete
    ]
    return SessionSummary(
        turns=turns,
        sessions_started=len(started),
        sessions_completed=len(complete),
        think_time=ThinkTime(distribution=settings.think_time_distribution, mean_s=settings.think_time_s),
        by_turn=tuple(by_turn),
        session_duration_s=_stats(durations),
        sentinels=sentinels,
    )


def describe(settings: SessionSettings, sessions: int, warmups: int) -> str:
    """A point's plan in words, for the log."""
    think = (
        f"{settings.think_time_distribution} think time, mean {settings.think_time_s:g} s"
        if settings.think_time_s
        else "no think time"
    )
    return f"{warmups} warmup session(s), then {sessions} session(s) of {settings.turns} turns, {think}"


__all__ = [
    "Conversation",
    "SessionRun",
    "SessionSpec",
    "count_prompts",
    "describe",
    "plan_sessions",
    "session_summary",
    "think_times",
]
