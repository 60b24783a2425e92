"""The DeepSeek-V3-shaped model (scripts/device/make_model.py --shape dsr1-shape), its
models.yaml entry and the one-H200 recipes that serve it (docs/gpu.md, "A DeepSeek-V3-shaped
model"). Nothing here needs a GPU: the config must load in transformers and in vLLM's own config
parsing, and the entry must be the full DeepSeek-R1 NVIDIA entry's flags on a smaller model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import require_vllm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "device"))

import make_model  # noqa: E402

# DeepSeek-R1-0528's config.json (huggingface.co/deepseek-ai/DeepSeek-R1-0528): the per-layer
# shapes that must stay the real model's.
R1_PER_LAYER = {
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("m") / "dsr1-shape"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/device/make_model.py"), "--shape", "dsr1-shape", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    return out


def test_config_keeps_r1_per_layer_shapes_in_four_layers(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    assert {k: cfg[k] for k in R1_PER_LAYER} == R1_PER_LAYER
    assert (cfg["num_hidden_layers"], cfg["first_k_dense_replace"], cfg["n_routed_experts"]) == (4, 1, 64)
    # Routing groups that 64 experts can satisfy: top-8 among the experts of topk_group groups.
    per_group = cfg["n_routed_experts"] // cfg["n_group"]
    assert cfg["n_routed_experts"] % cfg["n_group"] == 0 and cfg["topk_group"] * per_group >= cfg["num_experts_per_tok"]
    # The tokenizer is the tiny model's, and the config names its vocabulary and special tokens.
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == cfg["vocab_size"] == 2048
    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["model_max_length"] == cfg["max_position_embeddings"]


def test_transformers_reads_it_as_deepseek_v3(model_dir: Path) -> None:
    from transformers import AutoConfig, DeepseekV3Config

    cfg = AutoConfig.from_pretrained(model_dir)
    assert isinstance(cfg, DeepseekV3Config)
    assert cfg.qk_head_dim == 192 and cfg.num_hidden_layers == 4 and cfg.n_routed_experts == 64


def test_vllm_parses_it_as_an_fp8_mla_model(model_dir: Path) -> None:
    require_vllm()
    from vllm.config import ModelConfig

    mc = ModelConfig(model=str(model_dir), max_model_len=10240)
    assert mc.architectures == ["DeepseekV3ForCausalLM"]
    # MLA: one latent of 512 + the 64 rope values is the whole KV of a token and layer.
    assert mc.use_mla and mc.get_head_size() == 576
    assert mc.quantization == "fp8"


def test_build_is_idempotent_and_keeps_the_llama_default(tmp_path: Path) -> None:
    out = make_model.build(tmp_path / "d", make_model.DSR1_SHAPE)
    stamp = (out / "tokenizer.json").stat().st_mtime_ns
    assert make_model.build(out, make_model.DSR1_SHAPE) == out
    assert (out / "tokenizer.json").stat().st_mtime_ns == stamp
    # Another shape into the same directory rebuilds it.
    make_model.build(out, make_model.LLAMA_8B)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert make_model.CONFIG is make_model.LLAMA_8B


def test_models_entry_is_the_full_r1_nvidia_entry_on_dummy_weights() -> None:
    models = yaml.safe_load((ROOT / "models.yaml").read_text())["models"]
    shape, full = models["dsr1-shape"], models["deepseek-r1-0528-fp8-nvidia"]
    for key in ("prefill_flags", "decode_flags", "aggregated_flags"):
        assert shape[key] == {**full[key], "load-format": "dummy"}, key
    assert shape["max_model_len"] == full["max_model_len"] and shape["precision"] == full["precision"]
    assert shape["path"] == ".cache/models/dsr1-shape"
    assert shape["env"] == {"VLLM_USE_DEEP_GEMM": "0"}


@pytest.mark.parametrize("connector", ["pdbench", "nixl"])
def test_one_gpu_recipes_share_the_model_split_and_prompts(connector: str) -> None:
    recipe = yaml.safe_load((ROOT / "recipes" / f"dsr1-shape-fp8-h200x1-{connector}-1p1d.yaml").read_text())
    single = yaml.safe_load((ROOT / "recipes" / "dsr1-shape-fp8-h200x1-none-agg.yaml").read_text())
    assert recipe["connector"]["name"] == connector
    assert recipe["model"] == single["model"] == "dsr1-shape"
    assert recipe["benchmark"] == single["benchmark"]
    assert recipe["benchmark"]["shapes"] == [{"isl": 1024, "osl": 64}, {"isl": 4096, "osl": 64}]
    assert recipe["benchmark"]["concurrency"] == [1, 8] and recipe["benchmark"]["sentinels"]
    topo = recipe["topology"]
    assert topo["gpus_per_node"] == 1 and "tp" not in topo["prefill"] and "tp" not in topo["decode"]
    # Both instances on the one GPU: their shares fit it, and their KV is fixed (not profiled).
    shares = [topo[r]["flags"]["gpu-memory-utilization"] for r in ("prefill", "decode")]
    assert sum(shares) <= 0.9 and all("kv-cache-memory-bytes" in topo[r]["flags"] for r in ("prefill", "decode"))


@pytest.mark.parametrize(
    "recipe",
    ["dsr1-shape-fp8-h200x1-pdbench-1p1d", "dsr1-shape-fp8-h200x1-nixl-1p1d", "dsr1-shape-fp8-h200x1-none-agg"],
)
def test_validate_accepts_each_recipe(recipe: str) -> None:
    # Without --skip-flag-check: the installed vLLM's parser reads every rendered `vllm serve` line.
    # (Not --launcher local: that also wants the job's ports free here, which parallel tests hold.)
    require_vllm()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "validate", recipe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"ok: {recipe} ")
