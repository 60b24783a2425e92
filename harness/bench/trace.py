"""Trace replay in the Mooncake trace format: load a trace, synthesise its prompts, time its requests.

A trace is JSONL, one request per line: `timestamp` (ms from the trace's start), `input_length`
and `output_length` (tokens), and `hash_ids`: one id per block of `block_tokens` prompt tokens
(512 in Mooncake's traces), where equal ids mean equal blocks, so requests that share leading
ids share a prefix. Prompts are synthesised so that sharing is real at the token level: each hash
id gets one block of token ids (drawn from a seed and the id alone, so a block is the same
wherever it appears), a request's prompt is its blocks in order with the last one cut, and the
text is built so that it encodes back to exactly those ids (a server's prefix cache then sees
the trace's sharing, token for token).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.bench.client import RequestOutput
from harness.bench.dataset import MIN_WORD_IDS, SampleRequest
from harness.bench.tokenizer import PromptTokenizer
from harness.rundir.schedule_summary import Lateness, ScheduleSummary

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int  # prompt tokens the server sees, special tokens included
    output_length: int
    hash_ids: tuple[int, ...]
    where: str  # "file:line", for errors found later


def load_trace(path: str | Path) -> list[TraceRecord]:
    """Every request of a Mooncake-format trace, in file order (timestamps must not go back)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    records: list[TraceRecord] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: a trace line is a JSON object with {', '.join(FIELDS)}")
        for name in FIELDS:
            if name not in obj:
                raise TraceError(f"{where}: field '{name}' is missing")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise TraceError(f"{where}: field 'timestamp' must be a number of ms >= 0, got {ts!r}")
        if records and ts < records[-1].timestamp_ms:
            raise TraceError(
                f"{where}: field 'timestamp' {ts} is before the previous request's {records[-1].timestamp_ms}: "
                "a trace is in time order"
            )
        lengths = [obj[name] for name in ("input_length", "output_length")]
        for name, value in zip(("input_length", "output_length"), lengths, strict=True):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TraceError(f"{where}: field '{name}' must be a positive integer, got {value!r}")
        ids = obj["hash_ids"]
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids):
            raise TraceError(f"{where}: field 'hash_ids' must be a list of integers >= 0, got {ids!r}"[:300])
        if not ids:
            raise TraceError(f"{where}: field 'hash_ids' is empty: a prompt has at least one block")
        records.append(TraceRecord(float(ts), lengths[0], lengths[1], tuple(ids), where))
    if not records:
        raise TraceError(f"{path}: no requests in the trace")
    return records


class _Blocks:
    """Each hash id's block: `block_tokens` picks among the atoms (token ids), drawn from the
    seed and the id alone, so the same id gives the same block in any request, in any order."""

    def __init__(self, n_atoms: int, block_tokens: int, seed: int) -> None:
        self.n_atoms, self.block_tokens, self.seed = n_atoms, block_tokens, seed
        self._cache: dict[int, np.ndarray] = {}

    def __getitem__(self, hash_id: int) -> np.ndarray:
        block = self._cache.get(hash_id)
        if block is None:
            rng = np.random.default_rng([self.seed, hash_id])
            block = self._cache[hash_id] = rng.integers(0, self.n_atoms, size=self.block_tokens, dtype=np.int64)
        return block


def synthesize(
    tokenizer: PromptTokenizer, records: Sequence[TraceRecord], block_tokens: int, rng: np.random.Generator
) -> list[SampleRequest]:
    """One prompt per record: its hash ids' blocks in order, the last cut so that the server sees
    exactly `input_length` tokens (the tokenizer's special tokens included).

    With a tokenizer proven to join its whole-word tokens (PromptTokenizer.word_texts) the text
    is the join of the tokens' texts, which encodes to exactly those ids; any other tokenizer
    decodes the ids and must encode the text back to them, or the trace cannot be replayed with
    it (its sharing would not be real)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be at least 1, got {block_tokens}")
    texts = tokenizer.word_texts()
    atoms = tokenizer.word_ids()
    if texts is None and len(atoms) < MIN_WORD_IDS:
        atoms = tokenizer.allowed_ids()
    blocks = _Blocks(len(atoms), block_tokens, int(rng.integers(0, 2**63 - 1)))
    special = tokenizer.num_special
    out: list[SampleRequest] = []
    for rec in records:
        n = rec.input_length - special
        if n < 1:
            raise TraceError(
                f"{rec.where}: input_length {rec.input_length} leaves no room beside {special} special tokens"
            )
        need = -(-n // block_tokens)
        if need > len(rec.hash_ids):
            raise TraceError(
                f"{rec.where}: input_length {rec.input_length} needs {need} blocks of {block_tokens} tokens, "
                f"hash_ids has {len(rec.hash_ids)}"
            )
        picks = np.concatenate([blocks[h] for h in rec.hash_ids[:need]])[:n]
        if texts is not None:
            prompt = "".join(texts[picks].tolist())
        else:
            ids = atoms[picks].tolist()
            prompt = tokenizer.decode(ids)
            if tokenizer.encode(prompt) != ids:
                raise TraceError(
                    f"{rec.where}: this tokenizer does not encode the decoded blocks back to their ids, so the "
                    "trace's shared blocks would not be shared tokens; replay it with another model's tokenizer"
                )
        out.append(SampleRequest(prompt=prompt, prompt_len=rec.input_length, output_len=rec.output_length))
    return out


def offsets(records: Sequence[TraceRecord], speed: float) -> np.ndarray:
    """Each request's send time in s from the first request's: the trace's times over `speed`."""
    if not speed > 0 or not math.isfinite(speed):
        raise ValueError(f"speed must be a positive number, got {speed}")
    ts = np.array([r.timestamp_ms for r in records], dtype=np.float64)
    if not len(ts):
        return ts
    return (ts - ts[0]) / 1000.0 / speed


def _lateness(values_s: np.ndarray) -> Lateness | None:
    if not len(values_s):
        return None
    p50, p99, top = (float(x) * 1000.0 for x in np.percentile(values_s, [50, 99, 100]))
    return Lateness(p50=round(p50, 4), p99=round(p99, 4), max=round(top, 4))


def schedule_section(
    outs: Sequence[RequestOutput], offsets: Sequence[float] | np.ndarray, speed: float, cap: int
) -> ScheduleSummary:
    """The point's `schedule` section from its outputs (indexed like `offsets`).

    A sent request's lateness is its `queue_time` (send time minus scheduled time, taken by the
    load generator). It was cap-delayed when, at its scheduled time, `cap` other requests were in
    flight: no slot was free to send it; the others' lateness is the client's own."""
    sent = [o for o in outs if o.start_time is not None]
    late = np.array([o.queue_time for o in sent], dtype=np.float64)
    starts = np.array([o.start_time for o in sent], dtype=np.float64)
    ends = np.array([o.end_time if o.end_time is not None else math.inf for o in sent], dtype=np.float64)
    due = starts - late
    s_sorted, e_sorted = np.sort(starts), np.sort(ends)
    # In flight at a request's due time: sent strictly before it, not yet finished.
    busy = np.searchsorted(s_sorted, due, side="left") - np.searchsorted(e_sorted, due, side="right")
    delayed = busy >= cap
    # The most in flight at once: at each send, those started up to it minus those ended up to it.
    at_start = np.searchsorted(s_sorted, starts, side="right") - np.searchsorted(e_sorted, starts, side="right")
    return ScheduleSummary(
        requests=len(outs),
        sent=len(sent),
        speed=speed,
        span_s=round(float(offsets[-1]), 6) if len(offsets) else 0.0,
        cap=cap,
        in_flight_max=int(at_start.max()) if len(sent) else 0,
        cap_delayed=int(delayed.sum()),
        lateness_ms=_lateness(late),
        client_lateness_ms=_lateness(late[~delayed]),
    )
