"""The tokenizer the prompt sampler uses: transformers' tokenizer, run through `tokenizers`.

Importing transformers (which pulls in torch) and loading AutoTokenizer costs ~7 s of CPU
before the first request, and its Python wrapper adds tens of µs per encode. What counts
prompts the way the server does is the Rust tokenizer transformers builds on load (its
`backend_tokenizer`: tokenizer.json after the model class has set the BOS/EOS
post-processor and added tokens, which differs from tokenizer.json by class and version).
So that tokenizer is built once with transformers, serialized to a cache keyed by the
tokenizer files and the transformers version, and every later load reads it with the
`tokenizers` library alone (~0.1 s). Encoding and decoding go straight to it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from harness import atomic

log = logging.getLogger(__name__)


class PromptTokenizer:
    """What the sampler needs: encode/decode without special tokens, token counts with them,
    and the ids a random prompt may use."""

    def __init__(
        self, backend: Any, special_ids: set[int], vocab_size: int, source: str, word_ids: list[int] | None = None
    ) -> None:
        self._tok = backend  # a tokenizers.Tokenizer
        self._special = special_ids
        self._vocab_size = vocab_size
        self._allowed: np.ndarray | None = None
        self._words: np.ndarray | None = None if word_ids is None else np.asarray(word_ids, dtype=np.int64)
        self._word_texts: np.ndarray | None = None  # the text of each of _words, once proven joinable
        self._joinable: bool | None = None
        self.source = source  # "tokenizers" or "transformers", for the log
        self.num_special = backend.num_special_tokens_to_add(False)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def count(self, text: str) -> int:
        """Tokens the server sees for `text` as a prompt, special tokens included."""
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def word_ids(self) -> np.ndarray:
        """Allowed ids that decode to a space and letters and encode back to themselves alone:
        a run of them decodes to words that re-encode to the same ids, so a prompt of exact
        length usually takes one decode and one encode (see dataset.exact_length_prompt)."""
        if self._words is None:
            allowed = self.allowed_ids()
            texts = self._tok.decode_batch([[int(i)] for i in allowed], skip_special_tokens=False)
            cand = [(int(i), t) for i, t in zip(allowed, texts, strict=True) if t[1:].isalpha() and t[0] == " "]
            encoded = self._tok.encode_batch([t for _, t in cand], add_special_tokens=False)
            self._words = np.array([i for (i, _), e in zip(cand, encoded, strict=True) if e.ids == [i]], np.int64)
        return self._words

    def word_texts(self) -> np.ndarray | None:
        """The text of each whole-word id (indexed like word_ids()), when joining the texts of
        any run of them is exactly decoding it and encodes back to exactly those ids; else None.

        Then a prompt of N word ids is the join of N strings, with no encode to check it:
        ~1 µs per token less CPU (an 8k-token prompt took ~13 ms to encode). Proven once per
        process on a long run that holds every word: a pre-tokenizer that splits before each
        space (GPT-2/Llama-3 byte-level regexes) keeps " word" pieces apart, so a run that
        round-trips shows the tokenizer does not merge across them; one that does not (e.g.
        a tokenizer whose decoder strips the first space) takes the checked path."""
        if self._joinable is None:
            words = self.word_ids()
            self._joinable = False
            if len(words):
                texts = np.array(
                    self._tok.decode_batch([[int(i)] for i in words], skip_special_tokens=False), dtype=object
                )
                rng = np.random.default_rng(0)
                run = np.concatenate([rng.permutation(len(words)) for _ in range(max(1, 4096 // len(words)))])
                ids = words[run].tolist()
                text = "".join(texts[run].tolist())
                self._joinable = self.decode(ids) == text and self.encode(text) == ids
                self._word_texts = texts if self._joinable else None
        return self._word_texts

    def cache_entry(self) -> dict[str, Any]:
        return {
            "tokenizer": self._tok.to_str(),
            "special_ids": sorted(self._special),
            "vocab_size": self._vocab_size,
            "word_ids": self.word_ids().tolist(),
        }

    def allowed_ids(self) -> np.ndarray:
        """Vocabulary ids minus special and added tokens (which decode to control text)."""
        if self._allowed is None:
            ids = np.arange(self._vocab_size, dtype=np.int64)
            banned = np.fromiter((i for i in self._special if i < self._vocab_size), dtype=np.int64)
            self._allowed = np.setdiff1d(ids, banned, assume_unique=True)
        return self._allowed


def load_tokenizer(name_or_path: str, cache_dir: Path | None = None) -> PromptTokenizer:
    """`name_or_path`'s tokenizer as transformers builds it. A local directory's is cached in
    `cache_dir` (default: $PDBENCH_CACHE_DIR or ~/.cache/pdbench), keyed by the content of
    its tokenizer files and the transformers version, and later loads read the cache."""
    path = Path(name_or_path)
    cache_dir = cache_dir or Path(os.environ.get("PDBENCH_CACHE_DIR") or Path.home() / ".cache" / "pdbench")
    key = _cache_key(path) if path.is_dir() else None
    cached = cache_dir / "tokenizers" / f"{key}.json" if key else None
    if cached is not None and cached.is_file():
        try:
            return _from_cache(cached)
        except (ValueError, KeyError, OSError) as e:  # a damaged cache entry: rebuild it
            log.warning("tokenizer cache %s unusable (%s); rebuilding it", cached, e)
    tok = _from_transformers(name_or_path)
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(cached, json.dumps(tok.cache_entry()))
        except OSError as e:  # a read-only home: no cache, same tokenizer
            log.warning("cannot cache the tokenizer at %s: %s", cached, e)
    return tok


def _cache_key(path: Path) -> str | None:
    """Hash of the files transformers reads for a tokenizer, and its version; None if the
    directory holds no tokenizer.json (a slow tokenizer is never cached)."""
    if not (path / "tokenizer.json").is_file():
        return None
    from importlib.metadata import version

    h = hashlib.sha256(f"transformers {version('transformers')}\n".encode())
    for name in _TOKENIZER_FILES:
        f = path / name
        if f.is_file():
            h.update(f"{name} {f.stat().st_size}\n".encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:32]


# What AutoTokenizer reads besides tokenizer.json (the config decides class and flags).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


def _from_cache(file: Path) -> PromptTokenizer:
    from tokenizers import Tokenizer

    entry = json.loads(file.read_text())
    backend = Tokenizer.from_str(entry["tokenizer"])
    return PromptTokenizer(backend, set(entry["special_ids"]), int(entry["vocab_size"]), "cache", entry["word_ids"])


def _from_transformers(name: str) -> PromptTokenizer:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(name)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"tokenizer {name}: only fast (tokenizers-backed) tokenizers are supported")
    special = set(hf.all_special_ids) | set(hf.get_added_vocab().values())
    return PromptTokenizer(backend, special, hf.vocab_size, "transformers")
