"""Build the 8B-Llama-shaped model directory (config + the tiny tokenizer) for the GPU recipes.

Llama-3.1-8B's shape (32 layers, 32 heads, 8 KV heads, head dim 128, hidden 4096, MLP 14336)
with harness.tiny_model's locally trained tokenizer (vocab 2048), served with
`--load-format dummy`: the KV per token (128 KiB in bf16) and the compute per token are an
8B model's, and no weights need downloading.

    python scripts/device/make_model.py [OUT]     # default .cache/models/llama-8b-shape
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from harness import tiny_model  # noqa: E402

CONFIG = {
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


def build(out: Path) -> Path:
    """Write the directory atomically; a complete one with this config is left as is."""
    done = (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
    if done and json.loads((out / "config.json").read_text()) == CONFIG:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        tiny_model.build(tmp / "m")
        (tmp / "m" / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
        cfg_path = tmp / "m" / "tokenizer_config.json"
        tok_cfg = json.loads(cfg_path.read_text())
        tok_cfg["model_max_length"] = CONFIG["max_position_embeddings"]
        cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        (tmp / "m").rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / ".cache/models/llama-8b-shape"))
