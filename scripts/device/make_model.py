"""Build a model directory (config + the tiny tokenizer, no weights) for the GPU recipes.

Two shapes, each served with `--load-format dummy` (vLLM fills random weights), so the KV per
token and the compute per token are the real model's and nothing needs downloading; the
tokenizer is harness.tiny_model's, locally trained (vocab 2048), for every shape:

- `llama-8b-shape`: Llama-3.1-8B (32 layers, 32 heads, 8 KV heads, head dim 128, hidden 4096,
  MLP 14336), bf16: 128 KiB of KV per token.
- `dsr1-shape`: DeepSeek-V3/R1's per-layer shapes (MLA, routed experts, FP8 block weights as
  DeepSeek-R1-0528 ships them) in 4 layers, the first dense, 3 MoE.

    python scripts/device/make_model.py [--shape NAME] [OUT]   # default .cache/models/NAME
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

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

SHAPES: dict[str, dict[str, Any]] = {"llama-8b-shape": LLAMA_8B, "dsr1-shape": DSR1_SHAPE}
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b-shape")
    parser.add_argument("out", nargs="?", type=Path, help="default: .cache/models/SHAPE")
    args = parser.parse_args(argv)
    print(build(args.out or REPO / ".cache/models" / args.shape, SHAPES[args.shape]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
