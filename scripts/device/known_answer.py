"""Weights for a DeepSeek-V3-shaped model whose greedy answers are known: every answer repeats
the prompt's last PERIOD tokens, with margins far above what FP8 weights, an FP8 KV cache or a
different batch can move.

Why: random weights, dummy or at a trained model's scale, leave greedy answers without margins, so
sentinels part even on one instance against itself (docs/gpu.md); the seeds' model class has no
trained weights here. These are set by hand so that the answer travels the whole path a served
DeepSeek token travels, and breaks when any part of it does:

- layer 0's MLA attention reads it out of the KV cache: one head's rope queries and keys peak at
  the position PERIOD - 1 back (the rope part alone; the latent carries the token), so decode's
  first tokens come from the cache that prefill wrote and the connector moved;
- each MoE layer passes it on through its routed experts (every expert the same map, the router
  spreading tokens over all of them), so a token an expert-parallel exchange drops or misplaces
  loses it; the dense MLP, the shared experts and layers 1.. attention are zero;
- the embeddings write a token as two one-hot digits (id // 64, id % 64) and lm_head reads the
  last MoE layer's digits: the right token scores twice what a token sharing one digit scores.

Hidden dimensions, in 128-wide blocks (one FP8 scale block each): block 0 the prompt token's
digits, block 1 a constant (the rope's queries and keys, the experts' gates), block 2 layer 0's
answer, block 3 + k MoE layer k's. Each block holds two values of about 1 (RMSNorm then scales).
"""

from __future__ import annotations

import math
import re
import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PERIOD = 16  # each answer repeats the prompt's last PERIOD tokens
LO = 64  # a token's low digit: id % LO; its high digit id // LO
BLOCK = 128
TOKEN, CONST, ATTN = 0, BLOCK, 2 * BLOCK  # the first dimension of each block
ATTN_MARGIN_LOGITS = 24.0  # the softmax logit of the answer's position over any other's
ANSWER_MARGIN_LOGITS = 16.0  # lm_head: the answer's logit over a token sharing one digit
GATE = 4.0  # the experts' SiLU gate input: a constant, so each expert is a fixed linear map


def digits(config: dict[str, Any]) -> int:
    """How many dimensions a token's two one-hot digits take."""
    return math.ceil(config["vocab_size"] / LO) + LO


def check(config: dict[str, Any]) -> None:
    """Refuse a config these weights cannot encode, naming the key."""
    need = {
        "q_lora_rank": bool(config.get("q_lora_rank")),  # the query's rope comes through q_a/q_b
        "vocab_size": digits(config) <= BLOCK,
        "hidden_size": config["hidden_size"] >= BLOCK * (3 + _moe_layers(config)),
        "kv_lora_rank": config["kv_lora_rank"] >= digits(config),
        "v_head_dim": config["v_head_dim"] >= digits(config),
        "moe_intermediate_size": config.get("moe_intermediate_size", BLOCK) >= digits(config),
        "qk_rope_head_dim": config["qk_rope_head_dim"] % 2 == 0,
    }
    bad = [k for k, ok in need.items() if not ok]
    if bad:
        raise ValueError(f"known-answer weights cannot encode this config: {', '.join(bad)}")


def _moe_layers(config: dict[str, Any]) -> int:
    return sum(
        1
        for i in range(config["num_hidden_layers"])
        if config.get("n_routed_experts")
        and i >= config.get("first_k_dense_replace", 0)
        and i % config.get("moe_layer_freq", 1) == 0
    )


def rope_inv_freq(config: dict[str, Any]) -> list[float]:
    """The rope's angle per position of each pair, as vLLM's DeepseekScalingRotaryEmbedding and
    transformers' yarn compute them (plain rope without rope_scaling)."""
    dim, base = config["qk_rope_head_dim"], float(config["rope_theta"])
    extra = [base ** (-i / dim) for i in range(0, dim, 2)]
    rs = config.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) != "yarn":
        return extra
    factor, orig = float(rs["factor"]), rs["original_max_position_embeddings"]

    def corr(rot: float) -> float:
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr(rs["beta_fast"])), 0), min(math.ceil(corr(rs["beta_slow"])), dim - 1)
    high = high + 0.001 if low == high else high
    out = []
    for i, f in enumerate(extra):
        keep = 1 - min(max((i - low) / (high - low), 0.0), 1.0)  # 1: extrapolate (unscaled)
        out.append(f / factor * (1 - keep) + f * keep)
    return out


def softmax_scale(config: dict[str, Any]) -> float:
    """MLA's softmax scale: 1/sqrt(qk head dim), times yarn's mscale squared."""
    scale = (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]) ** -0.5
    rs = config.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) == "yarn" and rs.get("mscale_all_dim") and rs["factor"] > 1:
        m = 0.1 * rs["mscale_all_dim"] * math.log(rs["factor"]) + 1.0
        scale *= m * m
    return scale


def rope_margin(config: dict[str, Any], longest: int) -> float:
    """Over every key position up to `longest` back, the smallest gap between the answer's rope
    score (the sum of cosines, PERIOD - 1 back) and another's, in units of one pair's peak."""
    import numpy as np

    theta = np.array(rope_inv_freq(config))
    back = np.arange(0, longest + 1)
    score = np.cos(np.outer(back - (PERIOD - 1), theta)).sum(1)
    return float(score[PERIOD - 1] - np.delete(score, PERIOD - 1).max())


def weight(name: str, shape: tuple[int, ...], config: dict[str, Any], device: str = "cpu") -> torch.Tensor:
    """The float32 value of the linear or embedding weight `name`, on `device` (norms and the
    router's bias are the writer's: ones and zeros)."""
    import torch

    w = torch.zeros(shape, dtype=torch.float32, device=device)
    h, n_digits = config["hidden_size"], digits(config)
    ids = torch.arange(config["vocab_size"], device=device)
    hi, lo = ids // LO, math.ceil(config["vocab_size"] / LO) + ids % LO
    if name == "model.embed_tokens.weight":
        w[ids, TOKEN + hi] = 1.0
        w[ids, TOKEN + lo] = 1.0
        w[:, CONST] = 1.0
        return w
    moe = _moe_layers(config)
    if name == "lm_head.weight":
        # The final norm's input: the embedding's 3 values, layer 0's 2, 2 from each MoE layer.
        unit = math.sqrt(h / (3 + 2 * (1 + moe)))
        last = ATTN + BLOCK * moe
        w[ids, last + hi] = ANSWER_MARGIN_LOGITS / unit
        w[ids, last + lo] = ANSWER_MARGIN_LOGITS / unit
        return w
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
    if not m:
        raise ValueError(f"known-answer weights: no rule for {name}")
    layer, part = int(m.group(1)), m.group(2)
    if layer == 0 and part.startswith("self_attn."):
        _attention(w, part.removeprefix("self_attn."), config, torch.arange(n_digits, device=device))
    elif part == "mlp.gate":
        # Each token's own expert choice, so the exchange moves tokens to every expert.
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        w[:, TOKEN : TOKEN + n_digits] = torch.randn(shape[0], n_digits, generator=gen).to(device)
    elif re.fullmatch(r"mlp\.experts\.\d+\.(gate|up|down)_proj", part):
        k = layer - (config["num_hidden_layers"] - moe)  # this layer's place among the MoE layers
        src, dst = ATTN + BLOCK * k, ATTN + BLOCK * (k + 1)
        # The layer's input norm: the embedding's 3 values, layer 0's 2, 2 from each MoE layer before.
        unit = math.sqrt(h / (5 + 2 * k))
        rows = torch.arange(n_digits, device=device)
        if part.endswith("gate_proj"):
            w[rows, CONST] = GATE / unit
        elif part.endswith("up_proj"):
            w[rows, src + rows] = 1.0
        else:
            # Top-k weights sum to 1 (norm_topk_prob), then routed_scaling_factor: each value ~1.
            silu = GATE / (1 + math.exp(-GATE))
            w[dst + rows, rows] = 1.0 / (config.get("routed_scaling_factor", 1.0) * silu * unit)
    return w


def _attention(w: torch.Tensor, proj: str, config: dict[str, Any], rows: torch.Tensor) -> None:
    """Layer 0's MLA, head 0: rope scores that peak PERIOD - 1 positions back, values that carry
    the token's digits from the latent into the residual's ATTN block."""
    h = config["hidden_size"]
    nope, rope = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
    embed_unit = math.sqrt(h / 3)  # input norm of an embedding: 3 values of 1
    if proj == "q_a_proj":
        w[0, CONST] = 1.0  # alone in q_a: its norm makes it sqrt(q_lora_rank)
    elif proj == "q_b_proj":
        theta = rope_inv_freq(config)
        # Pair i of the query at angle -theta_i (PERIOD - 1) against keys at angle 0: the scores'
        # cosines all peak at that distance; b sets the margin in logits.
        b = ATTN_MARGIN_LOGITS / (softmax_scale(config) * rope_margin(config, config["max_position_embeddings"]))
        q_norm = math.sqrt(config["q_lora_rank"])
        for i, t in enumerate(theta):
            w[nope + 2 * i, 0] = b * math.cos(t * (PERIOD - 1)) / q_norm
            w[nope + 2 * i + 1, 0] = -b * math.sin(t * (PERIOD - 1)) / q_norm
    elif proj == "kv_a_proj_with_mqa":
        w[rows, TOKEN + rows] = 1.0
        kv = config["kv_lora_rank"]
        w[kv : kv + rope : 2, CONST] = 1.0 / embed_unit  # each key pair (1, 0) before its rotation
    elif proj == "kv_b_proj":
        w[nope + rows, rows] = 1.0  # head 0's values: the latent's digits
    elif proj == "o_proj":
        # The latent's norm makes its 2 values sqrt(kv_lora_rank / 2): back to 1 in the residual.
        w[ATTN + rows, rows] = 1.0 / math.sqrt(config["kv_lora_rank"] / 2)
