"""The known-answer weights (scripts/device/known_answer.py): a DeepSeek-V3-layout model whose
greedy answer repeats the prompt's last 16 tokens, read by MLA attention out of the KV cache and
carried by the routed experts. Checked in transformers' DeepseekV3 on the CPU, from the FP8
checkpoint make_model.py writes (dequantised), at a small config with the real per-head shapes."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "device"))

import known_answer  # noqa: E402
import make_model  # noqa: E402

PERIOD = known_answer.PERIOD
# make_model's CPU shape (R1's per-head MLA shapes and yarn rope, hidden 1024, 2 heads, 8 experts,
# 3 MoE layers) written with R1's FP8 blocks, as the GPU shape is.
SMALL = {
    **make_model.DSR1_TINY,
    "quantization_config": make_model.DSR1_SHAPE["quantization_config"],
    "torch_dtype": "bfloat16",
}


def _state(model_dir: Path) -> dict[str, Any]:
    """The checkpoint as transformers' DeepseekV3 holds it: FP8 weights dequantised (the values
    the GPU's block GEMMs compute with), each MoE layer's experts fused as transformers 5 fuses
    them (gate and up stacked, then down)."""
    import torch
    from safetensors.torch import load_file

    index = json.loads((model_dir / make_model.INDEX).read_text())
    raw: dict[str, Any] = {}
    for shard in set(index["weight_map"].values()):
        raw.update(load_file(str(model_dir / shard)))
    state = {
        name: make_model.dequantize_fp8_blocks(t, raw[name + "_scale_inv"])
        if t.dtype == torch.float8_e4m3fn
        else t.float()
        for name, t in raw.items()
        if not name.endswith("_scale_inv")
    }
    for layer in range(SMALL["num_hidden_layers"]):
        pre = f"model.layers.{layer}.mlp.experts"
        experts = sorted({int(m.group(1)) for n in state if (m := re.match(re.escape(pre) + r"\.(\d+)\.", n))})
        if not experts:
            continue
        state[f"{pre}.gate_up_proj"] = torch.stack(
            [
                torch.cat([state.pop(f"{pre}.{e}.gate_proj.weight"), state.pop(f"{pre}.{e}.up_proj.weight")])
                for e in experts
            ]
        )
        state[f"{pre}.down_proj"] = torch.stack([state.pop(f"{pre}.{e}.down_proj.weight") for e in experts])
    return state


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = make_model.build(tmp_path_factory.mktemp("known") / "m", SMALL)
    return make_model.build_weights(out, SMALL, weights="known-answer", device="cpu")


def _model(model_dir: Path, state: dict[str, Any]) -> Any:
    from transformers import AutoConfig, DeepseekV3ForCausalLM

    cfg = AutoConfig.from_pretrained(model_dir)
    del cfg.quantization_config  # the weights are dequantised: transformers' plain modules
    model = DeepseekV3ForCausalLM(cfg).float().eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert (missing, unexpected) == ([], []), (missing, unexpected)
    return model


@pytest.fixture(scope="module")
def model(model_dir: Path) -> Any:
    return _model(model_dir, _state(model_dir))


def _prompt(length: int, seed: int) -> Any:
    import torch

    # Any token but the specials (0-2): an EOS in the last 16 would end the answer early.
    return torch.randint(3, SMALL["vocab_size"], (1, length), generator=torch.Generator().manual_seed(seed))


def _greedy(model: Any, prompt: Any, n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, prompt.shape[1] :].tolist()


@pytest.mark.parametrize("length", [40, 700, 3000])
def test_greedy_answer_repeats_the_prompts_last_16_tokens(model: Any, length: int) -> None:
    prompt = _prompt(length, seed=length)
    last = prompt[0, -PERIOD:].tolist()
    assert len(set(last)) > PERIOD // 2  # precondition: a varied tail, so a repeat is no accident
    assert _greedy(model, prompt, 2 * PERIOD + 5) == (last * 3)[: 2 * PERIOD + 5]


def test_the_answer_has_margins(model: Any) -> None:
    import torch

    prompt = _prompt(500, seed=1)
    with torch.no_grad():
        logits = model(prompt).logits[0, -1]
    top2 = logits.topk(2).values
    # lm_head's margin over a token sharing one digit: 16 logits, as the weights set it.
    assert 15.0 < (top2[0] - top2[1]).item() < 17.0
    assert logits.argmax().item() == prompt[0, -PERIOD].item()


def test_the_answer_is_read_out_of_the_prompt_through_attention(model: Any) -> None:
    prompt = _prompt(300, seed=2)
    first = _greedy(model, prompt, 1)[0]
    # The token 16 back is the answer; changing the one 17 back changes nothing.
    other = prompt.clone()
    other[0, -PERIOD - 1] = 5 if other[0, -PERIOD - 1] != 5 else 6
    assert _greedy(model, other, 1)[0] == first
    other[0, -PERIOD] = 5 if other[0, -PERIOD] != 5 else 6
    assert _greedy(model, other, 1)[0] == other[0, -PERIOD].item() != first


def test_the_routed_experts_carry_the_answer(model_dir: Path, model: Any) -> None:
    import torch

    state = _state(model_dir)
    # Every MoE layer's router weights give the prompt's tokens different experts (their top 2 by
    # the gate's logits on the embeddings: a proxy for the routing, whose sigmoid and groups keep
    # the order within a group).
    prompt = _prompt(200, seed=3)
    with torch.no_grad():
        hidden = model.model.embed_tokens(prompt)[0]
    for layer in range(1, SMALL["num_hidden_layers"]):
        chosen = (hidden @ state[f"model.layers.{layer}.mlp.gate.weight"].T).topk(2, dim=-1).indices
        assert len(chosen.unique()) == SMALL["n_routed_experts"], layer
    # An expert map lost in one layer loses the answer.
    want = _greedy(model, prompt, 4)
    assert want == prompt[0, -PERIOD : -PERIOD + 4].tolist()
    state["model.layers.2.mlp.experts.down_proj"].zero_()
    assert _greedy(_model(model_dir, state), prompt, 4) != want


def test_rope_scores_peak_at_the_answers_position_for_any_prompt_length() -> None:
    # R1's yarn rope over max_model_len and beyond: the answer's position leads every other by
    # about one pair's peak, which the query scale turns into ATTN_MARGIN_LOGITS.
    cfg = make_model.DSR1_SHAPE
    margin = known_answer.rope_margin(cfg, 20_000)
    assert 1.0 < margin < 1.2
    assert known_answer.rope_margin(cfg, cfg["max_position_embeddings"]) == pytest.approx(margin)
    assert known_answer.softmax_scale(cfg) == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2)


def test_full_shape_is_encodable_and_a_config_that_is_not_is_refused() -> None:
    known_answer.check(make_model.DSR1_SHAPE)
    with pytest.raises(ValueError, match="hidden_size"):
        known_answer.check({**make_model.DSR1_SHAPE, "hidden_size": 512})
    with pytest.raises(ValueError, match="q_lora_rank"):
        known_answer.check({**make_model.DSR1_SHAPE, "q_lora_rank": None})
    with pytest.raises(ValueError, match="vocab_size"):
        known_answer.check({**make_model.DSR1_SHAPE, "vocab_size": 8192})
