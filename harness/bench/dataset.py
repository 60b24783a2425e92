"""Prompts for the benchmark: random ones of exact token length, or from a file; seeded.

Follows vLLM's `benchmarks/datasets/random.py`: sample token ids, decode to
text, re-encode and trim/extend until the re-encoded length is the target (see
`gen_prompt_decode_to_target_len`). Differences from vLLM, on purpose:
- ids are sampled uniformly from the vocabulary's whole-word tokens (a space and
  letters, encoding back to themselves) when it has at least MIN_WORD_IDS of them,
  so one decode and one encode usually give the exact length (with a tokenizer proven
  to round-trip any run of them, a join of their texts and no encode); otherwise, or when
  that encode differs, uniformly from the non-special vocabulary (vLLM uses a
  consecutive run of ids); padding ids are never special tokens;
- the fix-up loop keeps going (and restarts with fresh ids) until the length is
  exact, where vLLM gives up after 10 tries and logs a mismatch;
- `prompt_len` counts the special tokens the tokenizer adds (e.g. BOS), i.e. the
  prompt length the server sees; vLLM reports it without them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from harness.bench.tokenizer import PromptTokenizer

Convention = Literal["inferencex", "vllm"]


# Fewer word tokens than this would make prompts too alike: the general loop is used then.
MIN_WORD_IDS = 256


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int  # tokens the server sees for this prompt, special tokens included
    output_len: int  # max_tokens to request


def length_bounds(length: int, ratio: float, convention: Convention) -> tuple[int, int]:
    """Inclusive [low, high] for sampled lengths; low is at least 1 token."""
    if convention == "inferencex":
        low, high = int(length * ratio), length
    else:  # vllm
        low, high = math.floor(length * (1 - ratio)), math.ceil(length * (1 + ratio))
    return max(1, low), max(1, high)


def exact_length_prompt(
    tokenizer: PromptTokenizer,
    target: int,
    allowed: np.ndarray,
    rng: np.random.Generator,
    max_tries: int = 50,
    max_restarts: int = 20,
    prefix: str = "",
) -> str:
    """Text whose encoding (without special tokens) is exactly `target` ids long.

    With `prefix`, the text goes after it: `prefix + text` encodes to the prefix's own
    ids followed by exactly `target` more, so every prompt shares the prefix's tokens.
    """
    prefix_ids = tokenizer.encode(prefix) if prefix else []
    p = len(prefix_ids)
    words = tokenizer.word_ids()
    if len(words) >= MIN_WORD_IDS:
        # Whole words: decoding and re-encoding nearly always gives the same ids back.
        picks = rng.integers(0, len(words), size=target)
        texts = tokenizer.word_texts()
        if texts is not None and not prefix:
            return "".join(texts[picks].tolist())  # proven to round-trip: no encode needed
        ids = words[picks].tolist()
        text = tokenizer.decode(ids)
        if tokenizer.encode(prefix + text) == prefix_ids + ids:
            return text
    for _ in range(max_restarts):
        ids = allowed[rng.integers(0, len(allowed), size=target)].tolist()
        for _ in range(max_tries):
            # Decode/re-encode may merge or split tokens; trim or pad and retry.
            text = tokenizer.decode(ids)
            full = tokenizer.encode(prefix + text) if p else tokenizer.encode(text)
            if full[:p] != prefix_ids:
                break  # the text merged into the prefix's last token: fresh ids
            ids = full[p:]
            if len(ids) == target:
                return text
            if len(ids) > target:
                ids = ids[:target]
            else:
                ids += allowed[rng.integers(0, len(allowed), size=target - len(ids))].tolist()
    raise RuntimeError(f"could not build a prompt of exactly {target} tokens")


def make_prefix(tokenizer: PromptTokenizer, length: int, rng: np.random.Generator) -> str:
    """The shared random prefix: `length` tokens of text ("" for 0)."""
    if length == 0:
        return ""
    return exact_length_prompt(tokenizer, length, tokenizer.allowed_ids(), rng)


def sample_requests(
    tokenizer: PromptTokenizer,
    num_requests: int,
    isl: int,
    osl: int,
    range_ratio: float,
    convention: Convention,
    rng: np.random.Generator,
    prefix: str = "",
    prefix_len: int = 0,
) -> list[SampleRequest]:
    """Random prompts: `prefix` (`prefix_len` tokens, from make_prefix) + an isl-sampled part.

    prompt_len = prefix_len + the sampled input length (which counts the special tokens
    the tokenizer adds), as vLLM's --random-prefix-len adds the prefix to the input length.
    """
    num_special = tokenizer.num_special
    in_lo, in_hi = length_bounds(isl, range_ratio, convention)
    out_lo, out_hi = length_bounds(osl, range_ratio, convention)
    if in_lo <= num_special:
        raise ValueError(f"input length {in_lo} leaves no room beside {num_special} special tokens")
    # Lengths first, then prompts, as vLLM does: lengths do not depend on the tokenizer.
    input_lens = rng.integers(in_lo, in_hi + 1, size=num_requests)
    output_lens = rng.integers(out_lo, out_hi + 1, size=num_requests)
    allowed = tokenizer.allowed_ids()
    return [
        SampleRequest(
            prompt=prefix + exact_length_prompt(tokenizer, int(n_in) - num_special, allowed, rng, prefix=prefix),
            prompt_len=prefix_len + int(n_in),
            output_len=int(n_out),
        )
        for n_in, n_out in zip(input_lens, output_lens, strict=False)
    ]


# -- prompts from files ---------------------------------------------------------------

# vLLM's ShareGPT filter (datasets.is_valid_sequence defaults), kept for comparable runs.
SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


@dataclass(frozen=True)
class FileRecord:
    prompt: str
    output_len: int | None  # None: the configured osl
    reference: str | None = None  # ShareGPT: the recorded reply, whose length is the output length


class DatasetError(ValueError):
    """A prompt file that cannot be used; the message names the file (and line)."""


def load_records(path: str | Path, kind: Literal["jsonl", "sharegpt"]) -> list[FileRecord]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DatasetError(f"cannot read dataset {path}: {e}") from None
    records: list[FileRecord] = []
    if kind == "jsonl":
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: not JSON: {e}") from None
            prompt = obj.get("prompt") if isinstance(obj, dict) else None
            if not isinstance(prompt, str) or not prompt:
                raise DatasetError(f"{path}:{lineno}: needs a non-empty string 'prompt'")
            out = obj.get("output_len")
            if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
                raise DatasetError(f"{path}:{lineno}: 'output_len' must be a positive integer")
            records.append(FileRecord(prompt, out))
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: not JSON: {e}") from None
        if not isinstance(data, list):
            raise DatasetError(f"{path}: a ShareGPT file holds a JSON list of conversations")
        for entry in data:
            conv = entry.get("conversations", entry.get("conversation")) if isinstance(entry, dict) else None
            if not isinstance(conv, list) or len(conv) < 2:
                continue  # as vLLM: only conversations with a prompt and a reply
            turns = [t.get("value") if isinstance(t, dict) else None for t in conv[:2]]
            if all(isinstance(t, str) and t for t in turns):
                records.append(FileRecord(turns[0], None, turns[1]))  # type: ignore[arg-type]
    if not records:
        raise DatasetError(f"{path}: no usable prompts")
    return records


def sample_file_requests(
    tokenizer: PromptTokenizer,
    records: list[FileRecord],
    num_requests: int,
    osl: int,
    rng: np.random.Generator,
) -> list[SampleRequest]:
    """Draw prompts in a seeded random order (cycling if the file is small).

    prompt_len is the tokenizer's count with special tokens. Output length: the
    record's `output_len` (JSONL), the reply's token count (ShareGPT, as vLLM), else osl.
    ShareGPT entries outside vLLM's length filter are skipped.
    """
    out: list[SampleRequest] = []
    while len(out) < num_requests:
        took = False
        for idx in rng.permutation(len(records)).tolist():
            rec = records[idx]
            prompt_len = tokenizer.count(rec.prompt)
            if rec.reference is not None:
                output_len = tokenizer.count(rec.reference)
                if (
                    prompt_len < SHAREGPT_MIN_LEN
                    or output_len < SHAREGPT_MIN_LEN
                    or prompt_len > SHAREGPT_MAX_PROMPT
                    or prompt_len + output_len > SHAREGPT_MAX_TOTAL
                ):
                    continue
            else:
                output_len = rec.output_len if rec.output_len is not None else osl
            out.append(SampleRequest(rec.prompt, prompt_len, output_len))
            took = True
            if len(out) == num_requests:
                break
        if not took:
            raise DatasetError("no prompt in the dataset passes the length filter")
    return out
