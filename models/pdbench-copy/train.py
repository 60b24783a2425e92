"""Train the tiny `pdbench-copy` Llama: a 2-layer model that continues a repeated string.

Why: the connector's correctness proof needs greedy outputs that depend on every
prompt token's KV; random dummy weights tend to emit the same token whatever the
prompt. A copy task forces induction heads, so the continuation is read out of the
prompt's (transferred) KV, and corrupting that KV changes the output.

Task: ``S S S ...`` where S is a random string over [a-zA-Z0-9] of 4..120 chars;
the loss covers every token after the first copy of S. At inference a prompt
``S + S[:k]`` continues with ``S[k:]``. Char-level tokenizer: one token per char.

    .venv/bin/python models/pdbench-copy/train.py models/pdbench-copy   # ~5-10 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|begin|>", "<|pad|>"]
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
EXTRA = " .,;:|-!?\n"
VOCAB_SIZE = 128  # padded: the table only needs len(SPECIALS + ALPHABET + EXTRA)

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 1,
    "eos_token_id": 0,
    "pad_token_id": 2,
    "torch_dtype": "float32",
}


def vocab() -> dict[str, int]:
    return {t: i for i, t in enumerate(SPECIALS + list(ALPHABET + EXTRA))}


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models

    v = vocab()
    # BPE without merges and without a pre-tokenizer: exactly one token per char.
    tok = Tokenizer(models.BPE(vocab=v, merges=[]))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    tok.save(str(out / "tokenizer.json"))
    meta = {
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|begin|>",
            "eos_token": "<|endoftext|>",
            "pad_token": "<|pad|>",
            "model_max_length": CONFIG["max_position_embeddings"],
            "add_bos_token": False,
        },
        "special_tokens_map.json": {"bos_token": "<|begin|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>"},
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 0, "pad_token_id": 2},
        "config.json": CONFIG,
    }
    for name, data in meta.items():
        (out / name).write_text(json.dumps(data, indent=2) + "\n")


def batch(rng: random.Random, n: int, seq_len: int, max_period: int):
    import torch

    ids = vocab()
    x = torch.empty(n, seq_len, dtype=torch.long)
    mask = torch.zeros(n, seq_len, dtype=torch.bool)
    for i in range(n):
        period = rng.randint(4, max_period)
        s = [ids[c] for c in rng.choices(ALPHABET, k=period)]
        seq = (s * (seq_len // period + 2))[:seq_len]
        x[i] = torch.tensor(seq)
        mask[i, period:] = True  # predictable once S has been seen
    return x, mask


def train(out: Path, steps: int, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "architectures"}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=steps, pct_start=0.05)
    t0 = time.monotonic()
    for step in range(steps):
        # Short sequences first: induction forms faster; then longer ones.
        seq_len = 160 if step < steps // 2 else 320
        x, mask = batch(rng, 32, seq_len, max_period=48 if step < steps // 2 else 120)
        logits = model(input_ids=x).logits[:, :-1]
        target, m = x[:, 1:], mask[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[m], target[m])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            acc = (logits[m].argmax(-1) == target[m]).float().mean().item()
            print(f"step {step} loss {loss.item():.4f} acc {acc:.3f} {time.monotonic() - t0:.0f}s", flush=True)
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained rewrites config.json: keep ours (float32, architectures).
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(a.out)
    train(a.out, a.steps, a.seed)


if __name__ == "__main__":
    main()
