"""Random prompts of exact token length, seeded and reproducible.

Follows vLLM's `benchmarks/datasets/random.py`: sample token ids, decode to
text, re-encode and trim/extend until the re-encoded length is the target (see
`gen_prompt_decode_to_target_len`). Differences from vLLM, on purpose:
- ids are sampled uniformly from the non-special vocabulary (vLLM uses a
  consecutive run of ids), and padding ids are never special tokens;
- the fix-up loop keeps going (and restarts with fresh ids) until the length is
  exact, where vLLM gives up after 10 tries and logs a mismatch;
- `prompt_len` counts the special tokens the tokenizer adds (e.g. BOS), i.e. the
  prompt length the server sees; vLLM reports it without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from transformers import PreTrainedTokenizerBase

Convention = Literal["inferencex", "vllm"]


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


def allowed_token_ids(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """Vocabulary ids minus special and added tokens (which decode to control text)."""
    banned = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    return np.array([i for i in range(tokenizer.vocab_size) if i not in banned], dtype=np.int64)


def exact_length_prompt(
    tokenizer: PreTrainedTokenizerBase,
    target: int,
    allowed: np.ndarray,
    rng: np.random.Generator,
    max_tries: int = 50,
    max_restarts: int = 20,
) -> str:
    """Text whose encoding (without special tokens) is exactly `target` ids long."""
    for _ in range(max_restarts):
        ids = allowed[rng.integers(0, len(allowed), size=target)].tolist()
        for _ in range(max_tries):
            # Decode/re-encode may merge or split tokens; trim or pad and retry.
            text = tokenizer.decode(ids)
            ids = tokenizer.encode(text, add_special_tokens=False)
            if len(ids) == target:
                return text
            if len(ids) > target:
                ids = ids[:target]
            else:
                ids += allowed[rng.integers(0, len(allowed), size=target - len(ids))].tolist()
    raise RuntimeError(f"could not build a prompt of exactly {target} tokens")


def sample_requests(
    tokenizer: PreTrainedTokenizerBase,
    num_requests: int,
    isl: int,
    osl: int,
    range_ratio: float,
    convention: Convention,
    rng: np.random.Generator,
) -> list[SampleRequest]:
    num_special = tokenizer.num_special_tokens_to_add()
    in_lo, in_hi = length_bounds(isl, range_ratio, convention)
    out_lo, out_hi = length_bounds(osl, range_ratio, convention)
    if in_lo <= num_special:
        raise ValueError(f"input length {in_lo} leaves no room beside {num_special} special tokens")
    # Lengths first, then prompts, as vLLM does: lengths do not depend on the tokenizer.
    input_lens = rng.integers(in_lo, in_hi + 1, size=num_requests)
    output_lens = rng.integers(out_lo, out_hi + 1, size=num_requests)
    allowed = allowed_token_ids(tokenizer)
    return [
        SampleRequest(
            prompt=exact_length_prompt(tokenizer, int(n_in) - num_special, allowed, rng),
            prompt_len=int(n_in),
            output_len=int(n_out),
        )
        for n_in, n_out in zip(input_lens, output_lens)
    ]
