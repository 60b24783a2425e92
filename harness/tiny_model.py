"""Build a tiny Llama model directory offline: a config and a locally trained tokenizer.

There is no model hub here, so the local recipe serves this directory with
`--load-format dummy` (vLLM fills random weights). The tokenizer is real: the
benchmark client uses it to make prompts of exact token length.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|endoftext|>", "<|begin|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>"]

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 1,
    "eos_token_id": 0,
    "pad_token_id": 2,
    "torch_dtype": "float32",
}

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "or",
    "has",
    "had",
    "not",
    "but",
    "first",
    "one",
    "their",
    "its",
    "new",
    "after",
    "who",
    "they",
    "have",
    "two",
    "been",
    "other",
    "when",
    "there",
    "all",
    "during",
    "into",
    "school",
    "time",
    "may",
    "years",
    "more",
    "most",
    "only",
    "over",
    "city",
    "some",
    "world",
    "would",
    "where",
    "later",
    "up",
    "such",
    "used",
    "many",
    "can",
    "state",
    "about",
    "national",
    "out",
    "known",
    "university",
    "united",
    "then",
    "made",
    "prefill",
    "decode",
    "cache",
    "token",
    "server",
    "model",
    "latency",
    "throughput",
    "request",
    "stream",
    "node",
    "cluster",
    "tensor",
    "parallel",
    "expert",
    "batch",
    "queue",
    "memory",
    "transfer",
]


def _corpus(n_lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 30))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 100000)))
        if rng.random() < 0.2:
            words.append("".join(chr(rng.randint(33, 0x24F)) for _ in range(rng.randint(1, 6))))
        lines.append(" ".join(words).capitalize() + rng.choice([".", "!", "?", ",", ";"]))
    return lines


def build_tokenizer(seed: int = 0):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(20000, seed), trainer=trainer)
    return tok


def build(out_dir: Path, seed: int = 0) -> Path:
    """Write the model directory atomically; an existing complete directory is left as is."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and (out_dir / "tokenizer.json").is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    tok = build_tokenizer(seed)
    tok.save(str(tmp / "tokenizer.json"))
    files = {
        "config.json": CONFIG,
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 0, "pad_token_id": 2},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|begin|>",
            "eos_token": "<|endoftext|>",
            "pad_token": "<|pad|>",
            "model_max_length": CONFIG["max_position_embeddings"],
            "add_bos_token": False,
            "chat_template": CHAT_TEMPLATE,
        },
        "special_tokens_map.json": {
            "bos_token": "<|begin|>",
            "eos_token": "<|endoftext|>",
            "pad_token": "<|pad|>",
        },
    }
    for name, data in files.items():
        (tmp / name).write_text(json.dumps(data, indent=2) + "\n")
    os.chmod(tmp, 0o755)
    try:
        tmp.rename(out_dir)
    except OSError:
        # Another builder won the race; keep its complete directory.
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
