"""Sentinel prompts: in every point, a few greedy requests whose right answers are known.

Before the first measured batch (beside the load processes' start and the first point's
warmups), every point's sentinel prompts are answered whole by one instance that does not
disaggregate: the phase's first prefill server, asked directly (a request without
kv_transfer_params is served start to end by that instance under every vLLM KV connector and
the bundled one); an aggregated phase asks its first server. During each point the same prompts
go through the deployment as the measured requests do, spread over the point (sentinel k of m
leaves once k/m of its first measured - concurrency requests have finished, so the last is
answered while the batch still runs), at temperature 0 with a fixed seed and
vLLM's `return_token_ids`, and the answers are compared token by token (by character where a
server returns no ids). Their latencies are not in the point's metrics; their requests and tokens
are in the counts validity compares with the servers' /metrics, since the servers saw them.

They go out over aiohttp, not the measured client's fast path: a few requests per point, whose
tokens matter and whose clock does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from harness import atomic
from harness.bench.client import build_payload
from harness.bench.client_config import ENDPOINT_PATHS, ClientConfig
from harness.bench.dataset import SampleRequest
from harness.bench.loadgen import Progress
from harness.bench.resume import set_aside
from harness.bench.validity_probe import parse_target
from harness.rundir.sentinel_summary import SentinelSummary, Tolerance
from harness.validity.outputs import Divergence, OutputsCheck

CANCELLED = "cancelled: the point was stopped"
POLL_S = 0.05  # how often a point's sentinel driver looks at the measured requests' progress
# How long finish() waits for the driver of a batch that ran to its end (many polls).
DRIVER_WAIT_S = 5.0
EXCERPT = 40  # characters of the prompt and of each continuation shown in a divergence's reason


@dataclass
class Answer:
    """One streamed answer: its token ids (None when the server sent none) and text, by chunk."""

    chunks: list[tuple[list[int], str]] = field(default_factory=list)
    ids_missing: bool = False
    error: str | None = None

    @property
    def token_ids(self) -> list[int] | None:
        return None if self.ids_missing else [t for ids, _ in self.chunks for t in ids]

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.chunks)

    @property
    def output_tokens(self) -> int:
        ids = self.token_ids
        return len(ids) if ids is not None else len(self.chunks)

    def text_at_token(self, position: int) -> int:
        """The text offset where token `position` begins (by the chunks' tokens and texts)."""
        seen = offset = 0
        for ids, text in self.chunks:
            if seen + len(ids) > position:
                return offset
            seen += len(ids)
            offset += len(text)
        return offset

    def as_json(self) -> dict[str, Any]:
        return {"token_ids": self.token_ids, "text": self.text, "error": self.error}


def first_divergence(reference: Sequence[Any], answer: Sequence[Any]) -> int | None:
    """The first position where the two differ (a shorter one ends there); None when equal."""
    for i, (a, b) in enumerate(zip(reference, answer, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(answer) else min(len(reference), len(answer))


@dataclass
class Sentinel:
    index: int
    request: SampleRequest
    reference: Answer | None = None
    answer: Answer | None = None
    sent_after: int | None = None  # the point's measured requests finished when it left

    def compare(self) -> tuple[int | None, str] | None:
        """(first divergence, unit) of a sentinel answered on both paths; None otherwise."""
        ref, ans = self.reference, self.answer
        if ref is None or ans is None or ref.error is not None or ans.error is not None:
            return None
        ref_ids, ans_ids = ref.token_ids, ans.token_ids
        if ref_ids is not None and ans_ids is not None:
            return first_divergence(ref_ids, ans_ids), "token"
        return first_divergence(ref.text, ans.text), "character"


class SentinelClient:
    """Sends sentinel requests: streamed, greedy, seeded, asking for token ids."""

    def __init__(self, cfg: ClientConfig, session: aiohttp.ClientSession) -> None:
        self.cfg, self.session = cfg, session
        self.chat = cfg.endpoint == "chat"

    def payload(self, req: SampleRequest, cache_salt: str | None = None) -> dict[str, Any]:
        cfg = self.cfg
        body = build_payload(cfg.endpoint, cfg.model, req.prompt, req.output_len, cfg.ignore_eos)
        salt = {} if cache_salt is None else {"cache_salt": cache_salt}
        return body | {"seed": cfg.seed, "return_token_ids": True} | salt

    async def ask(self, url: str, req: SampleRequest, cache_salt: str | None = None) -> Answer:
        answer = Answer()
        timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_s)
        try:
            headers = self.cfg.request_headers()  # the API key and --header; the body stays greedy
            body = self.payload(req, cache_salt)
            async with self.session.post(url, json=body, timeout=timeout, headers=headers) as resp:
                if resp.status != 200:
                    answer.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    return answer
                done = False
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    self._event(json.loads(data), answer)
                    if answer.error is not None:
                        return answer
                if not done:
                    answer.error = "stream ended without data: [DONE]"
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            answer.error = f"{type(e).__name__}: {e}"
        return answer

    def _event(self, msg: dict[str, Any], answer: Answer) -> None:
        if msg.get("error") or msg.get("object") == "error":
            answer.error = f"error in stream: {json.dumps(msg.get('error', msg))[:300]}"
            return
        for choice in msg.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
            ids = choice.get("token_ids")
            if ids is None:
                if not text:
                    continue  # a chat role announcement or a usage-only chunk
                answer.ids_missing = True
                ids = []
            answer.chunks.append((list(ids), text or ""))


# vLLM's prefix cache keys a request's blocks by its cache_salt too: a decode server that answered
# the sentinels whole under this salt cannot serve the same prompts, sent later without it through
# the deployment, from its own cache instead of the KV transfer being checked.
DECODE_REFERENCE_SALT = "pdbench-sentinel-reference"


@dataclass
class Reference:
    """Where the sweep's reference answers come from: one instance, asked whole."""

    name: str
    url: str
    cache_salt: str | None = None

    @property
    def description(self) -> str:
        salt = "" if self.cache_salt is None else f" (cache_salt {self.cache_salt})"
        return f"{self.name}: whole requests to {self.url}{salt} before the measured requests"

    @classmethod
    def of(cls, cfg: ClientConfig) -> Reference | None:
        """The phase's first server of the role `sentinels.reference` names, else its first
        aggregated one; None without either."""
        role = cfg.sentinels.reference
        targets = [parse_target(t) for t in cfg.scrape]
        for wanted in (role, "aggregated"):
            for name, r, base in targets:
                if r == wanted:
                    salt = f"{DECODE_REFERENCE_SALT}-{cfg.seed}" if r == "decode" else None
                    return cls(name, base + ENDPOINT_PATHS[cfg.endpoint], salt)
        return None


async def answer_references(
    client: SentinelClient, reference: Reference, points: dict[str, list[Sentinel]], concurrency: int
) -> None:
    """Every sentinel of the sweep answered by the reference, `concurrency` at a time."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(s: Sentinel) -> None:
        async with gate:
            s.reference = await client.ask(reference.url, s.request, reference.cache_salt)

    await asyncio.gather(*(one(s) for sentinels in points.values() for s in sentinels))


def write_reference(path: Path, reference: Reference, points: dict[str, list[Sentinel]]) -> None:
    """reference.json: every sentinel's reference answer, by point; an earlier one is set aside."""
    if path.exists():
        set_aside(path)
    body = {
        "reference": reference.description,
        "url": reference.url,
        "points": {
            tag: [{"index": s.index, "prompt_len": s.request.prompt_len} | _answer(s.reference) for s in sentinels]
            for tag, sentinels in points.items()
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, body, indent=1, replace=False)


def _answer(a: Answer | None) -> dict[str, Any]:
    return a.as_json() if a is not None else {"token_ids": None, "text": None, "error": "not sent"}


class PointSentinels:
    """One point's sentinels: sent alongside its measured requests, then compared."""

    def __init__(
        self,
        client: SentinelClient,
        url: str,
        sentinels: list[Sentinel],
        measured: int,
        concurrency: int,
        progress: Progress,
    ) -> None:
        self.client, self.url, self.sentinels = client, url, sentinels
        self.measured, self.concurrency, self.progress = measured, concurrency, progress
        self._driver: asyncio.Task[None] | None = None
        self._sent: list[asyncio.Task[None]] = []
        # Each sentinel's comparison, taken once by finish(): the answers do not change after it.
        self._compared: dict[int, tuple[int | None, str] | None] = {}

    def start(self) -> None:
        if self.sentinels:
            self._driver = asyncio.create_task(self._drive())

    async def _drive(self) -> None:
        # Spread over the point's first measured - concurrency requests: the last sentinel leaves
        # while a whole wave is still in flight, so it is answered within the batch, not after it.
        m, span = len(self.sentinels), max(0, self.measured - self.concurrency)
        for k, s in enumerate(self.sentinels):
            due = k * span / m
            while self.progress.done < due:
                await asyncio.sleep(POLL_S)
            s.sent_after = self.progress.done
            self._sent.append(asyncio.create_task(self._send(s)))

    async def _send(self, s: Sentinel) -> None:
        s.answer = await self.client.ask(self.url, s.request)

    def cancel(self) -> None:
        """Send no more and cancel those in flight (a Ctrl-C); finish() then records them."""
        if self._driver is not None:
            self._driver.cancel()
        for t in self._sent:
            t.cancel()

    async def finish(self, stopped: bool) -> None:
        """After the measured batch. A batch that ran to its end has passed every sentinel's
        due point: the driver sends those it has not yet (within one poll) and they finish (each
        bounded by request_timeout_s). A stopped batch sends no more, and cancels those in flight."""
        if self._driver is not None:
            if stopped:
                self._driver.cancel()
            # Bounded all the same: a batch not stopped has finished every request, so the driver
            # is at most one poll from sending its last sentinel.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(self._driver, return_exceptions=True), DRIVER_WAIT_S)
        if stopped:
            for t in self._sent:
                t.cancel()
        await asyncio.gather(*self._sent, return_exceptions=True)
        for s in self.sentinels:
            if s.sent_after is not None and s.answer is None:
                s.answer = Answer(error=CANCELLED)
        self._compared = {s.index: s.compare() for s in self.sentinels}

    # -- what the point records ----------------------------------------------------

    def sent(self) -> list[Sentinel]:
        return [s for s in self.sentinels if s.sent_after is not None]

    def check(self, match_tokens: int | None, max_diverged: int, why_not: str | None = None) -> OutputsCheck:
        sent = self.sent()
        answered = [s for s in sent if s.answer is not None and s.answer.error is None]
        compared = exact = matched = 0
        diverged: list[Divergence] = []
        for s in answered:
            result = self._compared.get(s.index)
            if result is None:
                continue
            compared += 1
            position, unit = result
            exact += position is None
            if position is None or (match_tokens is not None and unit == "token" and position >= match_tokens):
                matched += 1
            else:
                diverged.append(_divergence(s, position, unit))
        if compared == 0 and why_not is None:
            refused = next((s.reference.error for s in answered if s.reference and s.reference.error), None)
            why_not = (
                f"the reference could not answer: {refused}"
                if refused
                else f"{len(answered)} of {len(self.sentinels)} sentinel(s) answered"
            )
        return OutputsCheck(
            sent=len(sent),
            answered=len(answered),
            compared=compared,
            exact=exact,
            matched=matched,
            match_tokens=match_tokens,
            max_diverged=max_diverged,
            diverged=diverged,
            why_not_compared=why_not if compared == 0 else None,
        )

    def summary(self, check: OutputsCheck, reference: str, record: str) -> SentinelSummary:
        """The result file's `sentinels` section."""
        positions: list[int | None] = []
        units = set()
        for s in self.sent():
            result = self._compared.get(s.index)
            positions.append(result[0] if result is not None else None)
            if result is not None:
                units.add(result[1])
        return SentinelSummary(
            reference=reference,
            sent=check.sent,
            answered=check.answered,
            compared=check.compared,
            exact=check.exact,
            matched=check.matched,
            match_rate=round(check.matched / check.compared, 4) if check.compared else None,
            first_divergence=tuple(positions),
            # Positions count tokens where both answers carried token ids, else characters.
            unit="token" if units == {"token"} else ("character" if units else None),
            tolerance=Tolerance(match_tokens=check.match_tokens, max_diverged=check.max_diverged),
            record=record,
        )

    def write_record(self, path: Path, tag: str, reference: str, check: OutputsCheck) -> None:
        """sentinels/<point tag>.json: every sentinel's prompt, both answers and the comparison."""
        rows = []
        for s in self.sentinels:
            result = self._compared.get(s.index)
            rows.append(
                {
                    "index": s.index,
                    "prompt": s.request.prompt,
                    "prompt_len": s.request.prompt_len,
                    "max_tokens": s.request.output_len,
                    "sent_after_measured": s.sent_after,
                    "reference": _answer(s.reference),
                    "answer": _answer(s.answer) if s.sent_after is not None else None,
                    "first_divergence": result[0] if result else None,
                    "unit": result[1] if result else None,
                }
            )
        if path.exists():
            set_aside(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"point": tag, "reference": reference, "check": check.model_dump(mode="json"), "sentinels": rows}
        atomic.write_json(path, body, indent=1, replace=False)

    def cancelled(self) -> int:
        """Sentinels sent and then cancelled because the point was stopped."""
        return sum(s.answer is not None and s.answer.error == CANCELLED for s in self.sent())

    def counts(self) -> tuple[int, int, int, int]:
        """(prompt tokens, output tokens, completed, failed) of the sentinels sent: the servers saw them."""
        sent = self.sent()
        ok = [s for s in sent if s.answer is not None and s.answer.error is None]
        return (
            sum(s.request.prompt_len for s in sent),
            sum(s.answer.output_tokens for s in ok if s.answer is not None),
            len(ok),
            len(sent) - len(ok),
        )


def _divergence(s: Sentinel, position: int, unit: str) -> Divergence:
    ref, ans = s.reference, s.answer
    assert ref is not None and ans is not None
    # Both continuations from a little before where they part (two tokens, or eight characters).
    if unit == "token":
        start_ref, start_ans = ref.text_at_token(max(0, position - 2)), ans.text_at_token(max(0, position - 2))
    else:
        start_ref = start_ans = max(0, position - 8)
    return Divergence(
        sentinel=s.index,
        position=position,
        unit=unit,
        prompt=s.request.prompt[:EXCERPT] + ("…" if len(s.request.prompt) > EXCERPT else ""),
        reference=ref.text[start_ref : start_ref + EXCERPT],
        answer=ans.text[start_ans : start_ans + EXCERPT],
    )
