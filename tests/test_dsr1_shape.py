"""The DeepSeek-V3-shaped model (scripts/device/make_model.py --shape dsr1-shape), its
models.yaml entry and the one-H200 recipes that serve it (docs/gpu.md, "A DeepSeek-V3-shaped
model"). Nothing here needs a GPU: the config must load in transformers and in vLLM's own config
parsing, and the entry must be the full DeepSeek-R1 NVIDIA entry's flags on a smaller model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    recipe, single = _recipe(f"dsr1-shape-fp8-h200x1-{connector}-1p1d"), _recipe("dsr1-shape-fp8-h200x1-none-agg")
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


X4 = [f"dsr1-shape-fp8-h200x4-{c}-{t}" for c in ("nixl", "pdbench") for t in ("1p2d", "1p1d-wideep")]
ONE_GPU = ["dsr1-shape-fp8-h200x1-pdbench-1p1d", "dsr1-shape-fp8-h200x1-nixl-1p1d", "dsr1-shape-fp8-h200x1-none-agg"]
X2 = ["dsr1-shape-fp8-h200x2-pdbench-1p1d"]
WEIGHTS = ["dsr1-shape-weights-fp8-h200x2-pdbench-1p1d"]


def _recipe(name: str) -> dict:
    return yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())


def test_x4_recipes_scale_the_full_ones_to_four_gpus_of_one_node() -> None:
    assert sorted(p.stem for p in (ROOT / "recipes").glob("dsr1-shape-*.yaml")) == sorted(ONE_GPU + X2 + X4 + WEIGHTS)
    for name in X4:
        topo = _recipe(name)["topology"]
        assert (topo["gpus_per_node"], topo["colocate"]) == (4, True), name
        assert (topo["prefill"]["tp"], topo["prefill"]["ep"]) == (2, 2), name
    p2 = _recipe("dsr1-shape-fp8-h200x4-nixl-1p2d")["topology"]
    assert (p2["decode"]["workers"], p2["decode"]["tp"]) == (2, 1) and "ep" not in p2["decode"]
    wide = _recipe("dsr1-shape-fp8-h200x4-nixl-1p1d-wideep")["topology"]["decode"]
    assert (wide["workers"], wide["tp"], wide["dp"], wide["ep"], wide["dp_attention"]) == (1, 1, 2, 2, True)
    # EPLB's redundant experts scaled with the experts: 32 of R1's 256, 8 of 64.
    full = _recipe("dsr1-fp8-h200-nixl-1p1d-wideep")["topology"]["decode"]["flags"]["eplb-config"]
    assert wide["flags"]["eplb-config"] == {**full, "num_redundant_experts": full["num_redundant_experts"] * 64 // 256}
    # Two GPUs: the MLA cache from prefill TP2+EP2 into a TP1 decode, both sharing GPU 0.
    x2 = _recipe("dsr1-shape-fp8-h200x2-pdbench-1p1d")["topology"]
    assert (x2["gpus_per_node"], x2.get("colocate", False)) == (2, False)
    assert (x2["prefill"]["tp"], x2["prefill"]["ep"], x2["decode"]["tp"]) == (2, 2, 1)
    for topo_name in ("1p2d", "1p1d-wideep"):
        nixl, bundled = (
            _recipe(f"dsr1-shape-fp8-h200x4-nixl-{topo_name}"),
            _recipe(f"dsr1-shape-fp8-h200x4-pdbench-{topo_name}"),
        )
        # The baseline: 4 one-GPU replicas in the NIXL recipe; the bundled connector's twin differs
        # only in its connector and in leaving the baseline to it.
        assert nixl["topology"]["aggregated"] == {"nodes": 1, "workers": 4, "tp": 1, "port": 8300}
        assert {k: v for k, v in nixl["topology"].items() if k != "aggregated"} == bundled["topology"]
        assert nixl["benchmark"] == bundled["benchmark"] and bundled["connector"]["name"] == "pdbench"
        # Issue 47's table: ISL 1k/4k/8k, OSL 256, c 1..32.
        bench = nixl["benchmark"]
        assert [(s["isl"], s["osl"]) for s in bench["shapes"]] == [(1024, 256), (4096, 256), (8192, 256)]
        assert bench["concurrency"] == [1, 2, 4, 8, 16, 32] and bench["sentinels"]


def test_docs_diffs_are_the_rendered_ones() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import render_diff

    assert [scaled for _, scaled in render_diff.PAIRS] == [X4[0], X4[1]]
    for full, scaled in render_diff.PAIRS:
        text = render_diff.diff(full, scaled)
        # precondition: the diff is of the prefill's TP8 scaled to TP2
        assert "\n-    --tensor-parallel-size 8 \\\n" in text and "\n+    --tensor-parallel-size 2 \\\n" in text, scaled
        kept = (ROOT / "docs" / "diffs" / f"{scaled}.diff").read_text()
        assert text == kept, f"docs/diffs/{scaled}.diff is stale: .venv/bin/python scripts/render_diff.py --write"
    # docs/gpu.md quotes the wide-EP decode worker's part of its diff, as the file has it.
    doc = (ROOT / "docs" / "gpu.md").read_text()
    quoted = doc.split("The wide-EP decode worker's part of the diff:\n\n```diff\n", 1)[1].split("\n```\n", 1)[0]
    assert "-    --all2all-backend deepep_low_latency" in quoted
    assert quoted in (ROOT / "docs" / "diffs" / f"{X4[1]}.diff").read_text(), "docs/gpu.md quotes a stale diff"


@pytest.fixture(scope="module")
def repo_model() -> Path:
    """The model directory where models.yaml puts it, built as the recipes tell a user to: validate
    checks that a local model exists on the submit host."""
    return make_model.build(ROOT / ".cache" / "models" / "dsr1-shape", make_model.SHAPES["dsr1-shape"])


@pytest.mark.parametrize("recipe", ONE_GPU + X4)
def test_validate_accepts_each_recipe(recipe: str, repo_model: Path) -> None:
    # The vLLM parser's part is tests/render/test_vllm_flags.py's every-shipped-recipe test, in one
    # process: here each validate would import vLLM again (7 x 10-40 s of CPU in the fast stage).
    # (Not --launcher local: that also wants the job's ports free here, which parallel tests hold.)
    assert (repo_model / "config.json").is_file()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "validate", recipe, "--skip-flag-check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"ok: {recipe} ")


def test_weights_recipe_is_the_two_gpu_one_on_init_scale_weights() -> None:
    models = yaml.safe_load((ROOT / "models.yaml").read_text())["models"]
    dummy, weights = models["dsr1-shape"], models["dsr1-shape-weights"]
    assert weights["path"] == ".cache/models/dsr1-shape-weights"
    for key in ("prefill_flags", "decode_flags", "aggregated_flags"):
        assert {**weights[key], "load-format": "dummy"} == dummy[key], key
    assert {k: weights[k] for k in ("precision", "max_model_len", "env")} == {
        k: dummy[k] for k in ("precision", "max_model_len", "env")
    }
    recipe, base = _recipe(WEIGHTS[0]), _recipe(X2[0])
    assert recipe["model"] == "dsr1-shape-weights"
    assert {k: v for k, v in recipe.items() if k not in ("model", "description")} == {
        k: v for k, v in base.items() if k not in ("model", "description")
    }


# A DeepSeek-V3 layout small enough for the CPU: partial edge blocks (kv_a's 160 rows, q_b's 192,
# kv_b's 96 inputs), one dense layer and one MoE layer of 4 experts, a shared expert, the tiny
# tokenizer's vocabulary. q_lora_rank stays a multiple of 128, as R1's 1536: vLLM fuses q_a and
# kv_a into one projection, whose scale blocks must then line up.
TINY = {
    **make_model.DSR1_SHAPE,
    "hidden_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": 128,
    "kv_lora_rank": 96,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 384,
    "moe_intermediate_size": 128,
    "n_routed_experts": 4,
    "n_group": 2,
    "topk_group": 1,
    "num_experts_per_tok": 2,
}


def _tiny_expected() -> dict[str, tuple[tuple[int, ...], str]]:
    """R1-0528's checkpoint names for TINY, written out: shape and dtype of each."""
    fp8, bf16 = "float8_e4m3fn", "bfloat16"
    want = {
        "model.embed_tokens.weight": ((2048, 256), bf16),
        "model.norm.weight": ((256,), bf16),
        "lm_head.weight": ((2048, 256), bf16),
    }

    def linear(name: str, out: int, inp: int) -> None:
        want[f"{name}.weight"] = ((out, inp), fp8)
        want[f"{name}.weight_scale_inv"] = ((-(-out // 128), -(-inp // 128)), "float32")

    for i in range(2):
        p = f"model.layers.{i}"
        want[f"{p}.input_layernorm.weight"] = ((256,), bf16)
        want[f"{p}.post_attention_layernorm.weight"] = ((256,), bf16)
        linear(f"{p}.self_attn.q_a_proj", 128, 256)
        want[f"{p}.self_attn.q_a_layernorm.weight"] = ((128,), bf16)
        linear(f"{p}.self_attn.q_b_proj", 2 * (32 + 64), 128)
        linear(f"{p}.self_attn.kv_a_proj_with_mqa", 96 + 64, 256)
        want[f"{p}.self_attn.kv_a_layernorm.weight"] = ((96,), bf16)
        linear(f"{p}.self_attn.kv_b_proj", 2 * (32 + 32), 96)
        linear(f"{p}.self_attn.o_proj", 256, 2 * 32)
    for proj, out, inp in (("gate_proj", 384, 256), ("up_proj", 384, 256), ("down_proj", 256, 384)):
        linear(f"model.layers.0.mlp.{proj}", out, inp)
    want["model.layers.1.mlp.gate.weight"] = ((4, 256), bf16)
    want["model.layers.1.mlp.gate.e_score_correction_bias"] = ((4,), "float32")
    for expert in [*(f"experts.{e}" for e in range(4)), "shared_experts"]:
        for proj, out, inp in (("gate_proj", 128, 256), ("up_proj", 128, 256), ("down_proj", 256, 128)):
            linear(f"model.layers.1.mlp.{expert}.{proj}", out, inp)
    return want


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = make_model.build(tmp_path_factory.mktemp("w") / "tiny", TINY)
    # Small shards: the index must name more than one file.
    return make_model.build_weights(out, TINY, seed=7, device="cpu", shard_bytes=200_000)


def _load(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    index = json.loads((model_dir / make_model.INDEX).read_text())
    tensors: dict[str, Any] = {}
    for shard in sorted(set(index["weight_map"].values())):
        for name, t in load_file(str(model_dir / shard)).items():
            assert index["weight_map"][name] == shard, name
            tensors[name] = t
    assert set(tensors) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    return tensors


def test_random_init_weights_have_r1_names_dtypes_and_shapes(tiny_weights: Path) -> None:
    tensors = _load(tiny_weights)
    assert len({*json.loads((tiny_weights / make_model.INDEX).read_text())["weight_map"].values()}) > 1
    got = {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in tensors.items()}
    assert got == _tiny_expected()


def test_random_init_weights_are_at_initialisation_scale(tiny_weights: Path) -> None:
    import torch

    tensors = _load(tiny_weights)
    for name, t in tensors.items():
        if name.endswith("norm.weight"):
            assert torch.equal(t, torch.ones_like(t)), name
        elif name.endswith("e_score_correction_bias"):
            assert not t.any(), name
        elif t.dtype == torch.float8_e4m3fn:
            w = make_model.dequantize_fp8_blocks(t, tensors[name + "_scale_inv"])
            # Block scales put each block's largest magnitude at FP8's largest value.
            blocks = make_model.quantize_fp8_blocks(w)[1]
            assert torch.allclose(blocks, tensors[name + "_scale_inv"], rtol=1e-2), name
            assert abs(w.mean().item()) < 0.004 and 0.018 < w.std().item() < 0.022, name
        elif name.endswith(".weight") and t.dtype == torch.bfloat16:
            assert abs(t.float().std().item() - 0.02) < 0.002, name


def test_random_init_is_seeded_and_idempotent(tiny_weights: Path, tmp_path: Path) -> None:
    import torch

    index = tiny_weights / make_model.INDEX
    stamp = index.stat().st_mtime_ns
    assert make_model.build_weights(tiny_weights, TINY, seed=7, device="cpu", shard_bytes=200_000) == tiny_weights
    assert index.stat().st_mtime_ns == stamp
    again = make_model.build_weights(make_model.build(tmp_path / "again", TINY), TINY, seed=7, device="cpu")
    other = make_model.build_weights(make_model.build(tmp_path / "other", TINY), TINY, seed=8, device="cpu")
    a, b, c = _load(tiny_weights), _load(again), _load(other)
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8))
    assert not torch.equal(a[name].view(torch.uint8), c[name].view(torch.uint8))


def test_full_shape_layout_is_the_documented_size() -> None:
    # docs/gpu.md: 9.1 GiB of weights with 64 experts; R1-0528's per-layer names and shapes.
    plan = make_model.dsr1_tensors(make_model.DSR1_SHAPE)
    total = sum(make_model._nbytes(shape, kind) for _, shape, kind in plan)
    assert 9.0 < total / 2**30 < 9.2
    shapes = {name: shape for name, shape, _ in plan}
    assert shapes["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (576, 7168)
    assert shapes["model.layers.1.self_attn.q_b_proj.weight"] == (128 * 192, 1536)
    assert shapes["model.layers.3.mlp.experts.63.down_proj.weight"] == (7168, 2048)
    assert "model.layers.4.self_attn.o_proj.weight" not in shapes  # R1's MTP layer: skipped by vLLM


# vLLM builds the model (on the meta device: shapes and names only) and loads the shards with its
# own load_weights; its model loader then refuses a model with any parameter left unloaded.
VLLM_LOAD = """
import json, sys
from pathlib import Path

import torch
from safetensors.torch import load_file

import vllm.model_executor.layers.quantization.fp8 as fp8
from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM

# vLLM's CPU build has no FP8 GEMM without AMX tiles; the GEMM kernel is not what is checked here.
fp8.init_fp8_linear_kernel = lambda *args, **kwargs: None
model_dir, scratch = Path(sys.argv[1]), Path(sys.argv[2])
vc = VllmConfig(model_config=ModelConfig(model=str(model_dir), max_model_len=1024), load_config=LoadConfig())
with set_current_vllm_config(vc):
    init_distributed_environment(1, 0, f"file://{scratch / 'dist'}", 0, "gloo")
    initialize_model_parallel(1, 1)
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(vllm_config=vc, prefix="")
    shards = sorted(set(json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"].values()))
    loaded = model.load_weights(kv for s in shards for kv in load_file(str(model_dir / s)).items())
    params = {name for name, _ in model.named_parameters()}
print(json.dumps({"params": len(params), "unloaded": sorted(params - loaded), "unknown": sorted(loaded - params)}))
"""


def test_vllm_loads_every_parameter_of_the_model(tiny_weights: Path, tmp_path: Path) -> None:
    require_vllm()
    proc = subprocess.run(
        [sys.executable, "-c", VLLM_LOAD, str(tiny_weights), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # 41: embeddings, lm_head, the final norm; 2 layers of MLA (fused q_a + kv_a) and norms; the
    # dense MLP, the MoE layer's router, bias, fused experts and shared expert, with their scales.
    assert got == {"params": 41, "unloaded": [], "unknown": []}
