"""Prompts of exact token length, sampled length bounds, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from harness import tiny_model
from harness.bench.config import BenchConfig
from harness.bench.dataset import length_bounds, sample_requests

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m")))


def test_length_bounds():
    assert length_bounds(100, 0.8, "inferencex") == (80, 100)
    assert length_bounds(100, 1.0, "inferencex") == (100, 100)
    assert length_bounds(100, 0.0, "inferencex") == (1, 100)  # never 0 tokens
    assert length_bounds(100, 0.25, "vllm") == (75, 125)
    assert length_bounds(10, 0.33, "vllm") == (6, 14)  # floor / ceil
    assert length_bounds(100, 0.0, "vllm") == (100, 100)


@pytest.mark.parametrize(
    ("convention", "ratio", "in_bounds", "out_bounds"),
    [("inferencex", 0.5, (48, 96), (8, 16)), ("vllm", 0.25, (72, 120), (12, 20)), ("inferencex", 1.0, (96, 96), (16, 16))],
)
def test_exact_prompt_lengths(tok, convention, ratio, in_bounds, out_bounds):
    reqs = sample_requests(tok, 60, 96, 16, ratio, convention, np.random.default_rng(1))
    special = set(tok.all_special_ids) | set(tok.get_added_vocab().values())
    for r in reqs:
        ids = tok(r.prompt).input_ids
        assert len(ids) == r.prompt_len
        assert not special & set(ids)
        assert in_bounds[0] <= r.prompt_len <= in_bounds[1]
        assert out_bounds[0] <= r.output_len <= out_bounds[1]
    if in_bounds[0] != in_bounds[1]:  # lengths really vary across the range
        assert len({r.prompt_len for r in reqs}) > 5


def test_reproducible_with_seed(tok):
    def sample(seed):
        return sample_requests(tok, 8, 64, 8, 0.5, "inferencex", np.random.default_rng(seed))

    assert sample(7) == sample(7)
    assert [r.prompt for r in sample(7)] != [r.prompt for r in sample(8)]


def _cfg(**kw):
    base = dict(base_url="http://127.0.0.1:1", model="m", tokenizer="t", isl=8, osl=8,
                concurrency=[1], result_dir="r", prefill_gpus=1, decode_gpus=1)
    return BenchConfig(**(base | kw))


def test_config_defaults_and_validation():
    cfg = _cfg(concurrency=[1, 4])
    assert cfg.url == "http://127.0.0.1:1/v1/completions"
    assert cfg.num_prompts_for(1) == 16 and cfg.num_prompts_for(4) == 40
    assert cfg.num_warmups_for(4) == 8
    assert _cfg(endpoint="chat").url.endswith("/v1/chat/completions")
    assert BenchConfig.model_validate_json(cfg.model_dump_json()) == cfg  # inf survives JSON
    for bad in (dict(range_ratio_convention="vllm"), dict(concurrency=[2, 2]), dict(isl=0),
                dict(unknown=1), dict(base_url="127.0.0.1:1"), dict(range_ratio=1.5)):
        with pytest.raises(ValidationError):
            _cfg(**bad)
