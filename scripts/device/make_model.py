"""Build a model directory (config + the tiny tokenizer, no weights) for the GPU recipes.

Two shapes, each served with `--load-format dummy` (vLLM fills random weights), so the KV per
token and the compute per token are the real model's and nothing needs downloading; the
tokenizer is harness.tiny_model's, locally trained (vocab 2048), for every shape:

- `llama-8b-shape`: Llama-3.1-8B (32 layers, 32 heads, 8 KV heads, head dim 128, hidden 4096,
  MLP 14336), bf16: 128 KiB of KV per token.
- `dsr1-shape`: DeepSeek-V3/R1's per-layer shapes (MLA, routed experts, FP8 block weights as
  DeepSeek-R1-0528 ships them) in 4 layers, the first dense, 3 MoE.

`--weights random-init` (dsr1-shape) also writes weights: as transformers initialises a model
(normal(0, initializer_range) for linear and embedding weights, ones for RMSNorm, zeros for the
router's score correction bias), seeded, in DeepSeek-R1-0528's checkpoint names and dtypes (FP8
e4m3 in 128x128 blocks with float32 `weight_scale_inv` where R1 has them, bf16 elsewhere),
sharded, with `model.safetensors.index.json`. Made because dummy weights (vLLM's uniform
+-1e-3) leave the logits nearly tied; measured on H200s, weights at a trained model's scale do
not give greedy answers margins either (random logits are no more peaked at any scale): the
sentinels still part, even on one instance against itself (docs/gpu.md, "Init-scale weights do
not give the sentinels margins").

`--weights known-answer` (dsr1-shape) writes weights set by hand instead (known_answer.py): every
greedy answer repeats the prompt's last 16 tokens, read out of the KV cache by MLA and carried by
the routed experts, with margins; on an H200 every sentinel matched (docs/gpu.md, "Known-answer
weights").

    python scripts/device/make_model.py [--shape NAME] [OUT]   # default .cache/models/NAME
    python scripts/device/make_model.py --shape dsr1-shape --weights random-init [--seed N] [--device cuda] OUT
    python scripts/device/make_model.py --shape dsr1-shape --weights known-answer [--device cuda] OUT
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import known_answer  # noqa: E402

from harness import tiny_model  # noqa: E402

LLAMA_8B = {
    **tiny_model.CONFIG,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
}

# DeepSeek-R1-0528's config.json with fewer layers and experts; every per-layer shape is its own.
DSR1_SHAPE = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    # MLA: queries through a 1536 low-rank, keys and values through one 512 latent plus a
    # 64-wide shared rope key. The KV cache holds 576 values per token and layer.
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    # Layer 0 dense (as R1's first 3), layers 1-3 MoE.
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    # 64 routed experts, not R1's 256: 9.1 GiB of weights instead of 32.8, and over EP2 32 a GPU,
    # as R1's 256 over EP8 (docs/gpu.md, "A DeepSeek-V3-shaped model").
    # The grouped routing keeps R1's 8 groups of which 4 are picked (8 experts a group here,
    # 32 there); vLLM's fused grouped top-k takes up to 32 groups.
    "n_routed_experts": 64,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "ep_size": 1,
    "num_nextn_predict_layers": 1,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
    "tie_word_embeddings": False,
    "use_cache": True,
    "torch_dtype": "bfloat16",
    # The tiny tokenizer's vocabulary and special tokens, not R1's.
    "vocab_size": tiny_model.VOCAB_SIZE,
    "bos_token_id": tiny_model.CONFIG["bos_token_id"],
    "eos_token_id": tiny_model.CONFIG["eos_token_id"],
    "pad_token_id": tiny_model.CONFIG["pad_token_id"],
}

# DSR1_SHAPE small enough for vLLM's CPU build: R1's per-head MLA shapes and rope, the same 4
# layers (1 dense, 3 MoE), hidden 1024, 2 heads, 8 experts in 2 groups (2 a token), fp32 and no
# FP8 (the CPU build has no FP8 GEMM). What CI serves the MLA cache and the experts with
# (recipes/dsr1-tiny-known-fp32-cpu-pdbench-1p1d.yaml), on --weights known-answer.
DSR1_TINY = {
    **{k: v for k, v in DSR1_SHAPE.items() if k != "quantization_config"},
    "hidden_size": 1024,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": 256,
    "intermediate_size": 256,
    "moe_intermediate_size": 128,
    "n_routed_experts": 8,
    "n_group": 2,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}

SHAPES: dict[str, dict[str, Any]] = {"llama-8b-shape": LLAMA_8B, "dsr1-shape": DSR1_SHAPE, "dsr1-tiny": DSR1_TINY}
# The name llama-8b-shape's callers import.
CONFIG = LLAMA_8B


def build(out: Path, config: dict[str, Any] = LLAMA_8B) -> Path:
    """Write the directory atomically; a complete one with this config is left as is."""
    done = (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
    if done and json.loads((out / "config.json").read_text()) == config:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        tiny_model.build(tmp / "m")
        (tmp / "m" / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        cfg_path = tmp / "m" / "tokenizer_config.json"
        tok_cfg = json.loads(cfg_path.read_text())
        tok_cfg["model_max_length"] = config["max_position_embeddings"]
        cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        (tmp / "m").rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# --- weights at a trained model's scale (--weights random-init) ---------------------------------

FP8_BLOCK = 128  # R1-0528's quantization_config weight_block_size
FP8_MAX = 448.0  # the largest float8_e4m3fn
INDEX = "model.safetensors.index.json"
SHARD_BYTES = 4 << 30
# What a tensor holds: an FP8 block-quantised linear weight, a bf16 one (normal), an RMSNorm
# weight (ones, bf16), the router's score correction bias (zeros, float32, as R1 ships it).
FP8, BF16, NORM, BIAS = "fp8", "bf16", "norm", "bias"
# How a kind of weights fills one linear or embedding tensor: name, shape -> float32 values.
Fill = Callable[[str, tuple[int, ...]], "torch.Tensor"]
WEIGHTS = ("random-init", "known-answer")


def dsr1_tensors(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of every weight of `config` in DeepSeek-V3/R1-0528's checkpoint layout.

    FP8 as in R1-0528: every linear layer of attention and of the MLPs (dense, routed and shared
    experts); bf16: the embeddings, lm_head, the norms and the router (`mlp.gate`, which vLLM builds
    unquantised); R1's multi-token-prediction layer (layer `num_hidden_layers`) is left out: vLLM
    skips it for the main model."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    qk_head = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    out: list[tuple[str, tuple[int, ...], str]] = [("model.embed_tokens.weight", (config["vocab_size"], h), BF16)]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", (h,), NORM), (f"{p}.post_attention_layernorm.weight", (h,), NORM)]
        a = f"{p}.self_attn"
        if config.get("q_lora_rank"):
            q = config["q_lora_rank"]
            out += [
                (f"{a}.q_a_proj.weight", (q, h), FP8),
                (f"{a}.q_a_layernorm.weight", (q,), NORM),
                (f"{a}.q_b_proj.weight", (heads * qk_head, q), FP8),
            ]
        else:
            out.append((f"{a}.q_proj.weight", (heads * qk_head, h), FP8))
        kv = config["kv_lora_rank"]
        out += [
            (f"{a}.kv_a_proj_with_mqa.weight", (kv + config["qk_rope_head_dim"], h), FP8),
            (f"{a}.kv_a_layernorm.weight", (kv,), NORM),
            (f"{a}.kv_b_proj.weight", (heads * (config["qk_nope_head_dim"] + config["v_head_dim"]), kv), FP8),
            (f"{a}.o_proj.weight", (h, heads * config["v_head_dim"]), FP8),
        ]
        moe = (
            config.get("n_routed_experts")
            and i >= config.get("first_k_dense_replace", 0)
            and i % config.get("moe_layer_freq", 1) == 0
        )
        if not moe:
            out += _mlp(f"{p}.mlp", h, config["intermediate_size"])
            continue
        experts, inter = config["n_routed_experts"], config["moe_intermediate_size"]
        out.append((f"{p}.mlp.gate.weight", (experts, h), BF16))
        if config.get("topk_method") == "noaux_tc":
            out.append((f"{p}.mlp.gate.e_score_correction_bias", (experts,), BIAS))
        for e in range(experts):
            out += _mlp(f"{p}.mlp.experts.{e}", h, inter)
        if config.get("n_shared_experts"):
            out += _mlp(f"{p}.mlp.shared_experts", h, inter * config["n_shared_experts"])
    return [*out, ("model.norm.weight", (h,), NORM), ("lm_head.weight", (config["vocab_size"], h), BF16)]


def _mlp(prefix: str, hidden: int, inter: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [
        (f"{prefix}.gate_proj.weight", (inter, hidden), FP8),
        (f"{prefix}.up_proj.weight", (inter, hidden), FP8),
        (f"{prefix}.down_proj.weight", (hidden, inter), FP8),
    ]


def quantize_fp8_blocks(w: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` (out, in) as float8_e4m3fn and its float32 `weight_scale_inv` (ceil(out/block),
    ceil(in/block)), DeepSeek's convention: the weight is fp8 x scale_inv, each block's largest
    magnitude at FP8_MAX. Partial edge blocks are scaled by what they hold."""
    import torch

    rows, cols = w.shape
    br, bc = math.ceil(rows / block), math.ceil(cols / block)
    padded = torch.zeros(br * block, bc * block, dtype=torch.float32, device=w.device)
    padded[:rows, :cols] = w
    blocks = padded.view(br, block, bc, block)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(br * block, bc * block)[:rows, :cols].contiguous(), scale


def dequantize_fp8_blocks(q: torch.Tensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    rows, cols = q.shape
    s = scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    return q.float() * s


def _tensors(
    name: str, shape: tuple[int, ...], kind: str, fill: Fill, fp8: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """One weight (and its scale), on the CPU: norms ones, the router's bias zeros, the rest
    `fill`'s float32 values, FP8-quantised in blocks where R1 has FP8 (float32 when not `fp8`)."""
    import torch

    if kind == NORM:
        yield name, torch.ones(shape, dtype=torch.bfloat16)
        return
    if kind == BIAS:
        yield name, torch.zeros(shape, dtype=torch.float32)
        return
    w = fill(name, shape)
    if not fp8:
        yield name, w.float().cpu()
        return
    if kind == BF16:
        yield name, w.to(torch.bfloat16).cpu()
        return
    q, scale = quantize_fp8_blocks(w)
    yield name, q.cpu()
    yield name.removesuffix("weight") + "weight_scale_inv", scale.cpu()


def random_init(std: float, seed: int, device: str) -> Fill:
    """normal(0, std) as transformers initialises; each tensor has its own generator, seeded from
    `seed` and its name: the same weights whatever the order or sharding (on one device kind)."""

    def fill(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        import torch

        gen = torch.Generator(device=device)
        gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        return torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, std, generator=gen)

    return fill


def _nbytes(shape: tuple[int, ...], kind: str) -> int:
    n = math.prod(shape)
    if kind == FP8:
        return n + 4 * math.ceil(shape[0] / FP8_BLOCK) * math.ceil(shape[1] / FP8_BLOCK)
    return n * (4 if kind == BIAS else 2)


def build_weights(
    out: Path,
    config: dict[str, Any],
    *,
    weights: str = "random-init",
    seed: int = 0,
    device: str | None = None,
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    """Write `config`'s weights into the model directory `out` (built first by build()): shards
    `model-0000K-of-0000N.safetensors`, then the index, last. `weights`: random-init (at
    initialisation scale, seeded) or known-answer (known_answer.py: greedy answers repeat the
    prompt's last tokens). A directory whose index records the same making is left as is."""
    import torch
    from safetensors.torch import save_file

    made_by: dict[str, Any]
    if weights == "random-init":
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        std = float(config["initializer_range"])
        # The generator's numbers depend on the device kind (CPU or CUDA) as well as on the seed.
        made_by = {"weights": weights, "seed": seed, "device": torch.device(device).type, "std": std}
        fill = random_init(std, seed, device)
    elif weights == "known-answer":
        known_answer.check(config)
        made_by = {"weights": weights, "period": known_answer.PERIOD}
        where = device or ("cuda" if torch.cuda.is_available() else "cpu")

        def fill(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            return known_answer.weight(name, shape, config, where)
    else:
        raise ValueError(f"weights: {weights!r} is not one of {', '.join(WEIGHTS)}")
    made_by["config_crc32"] = _config_crc(config)
    index = out / INDEX
    if index.is_file():
        old = json.loads(index.read_text())
        if old.get("metadata", {}).get("pdbench") == made_by and all(
            (out / f).is_file() for f in set(old["weight_map"].values())
        ):
            return out
    plan = dsr1_tensors(config)
    # A config without quantization_config (dsr1-tiny) is written unquantised, in float32.
    fp8 = "quantization_config" in config
    shards: list[list[tuple[str, tuple[int, ...], str]]] = [[]]
    size = 0
    for entry in plan:
        n = _nbytes(entry[1], entry[2])
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += n
    for old_shard in out.glob("model-*-of-*.safetensors"):
        old_shard.unlink()
    index.unlink(missing_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for k, shard in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tensors = dict(kv for name, shape, kind in shard for kv in _tensors(name, shape, kind, fill, fp8))
        tmp = out / (fname + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.rename(out / fname)
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    meta = {"total_size": total, "pdbench": made_by}
    tmp_index = out / (INDEX + ".tmp")
    tmp_index.write_text(
        json.dumps({"metadata": meta, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n"
    )
    tmp_index.rename(index)
    return out


def _config_crc(config: dict[str, Any]) -> int:
    return zlib.crc32(json.dumps(config, sort_keys=True).encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b-shape")
    parser.add_argument(
        "--weights",
        choices=["none", *WEIGHTS],
        default="none",
        help="none: config and tokenizer (served with --load-format dummy); random-init: also "
        "weights at initialisation scale in R1-0528's checkpoint layout (dsr1-shape only); "
        "known-answer: weights set by hand whose greedy answers repeat the prompt's last "
        f"{known_answer.PERIOD} tokens (dsr1-shape only)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random-init's seed (default 0)")
    parser.add_argument("--device", help="where the weights are made (default: cuda if present)")
    parser.add_argument("out", nargs="?", type=Path, help="default: .cache/models/SHAPE")
    args = parser.parse_args(argv)
    if args.weights != "none" and not args.shape.startswith("dsr1-"):
        parser.error(f"--weights {args.weights} writes DeepSeek-V3/R1's layout: --shape dsr1-shape or dsr1-tiny")
    out = build(args.out or REPO / ".cache/models" / args.shape, SHAPES[args.shape])
    if args.weights != "none":
        build_weights(out, SHAPES[args.shape], weights=args.weights, seed=args.seed, device=args.device)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
