"""Prompts of exact token length, sampled length bounds, reproducibility."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from harness import tiny_model
from harness.bench.client_config import ClientConfig
from harness.bench.dataset import length_bounds, sample_requests
from harness.bench.tokenizer import load_tokenizer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


@pytest.fixture(scope="module")
def tok(model_dir):
    """The server's view of the prompts (transformers), which the tests check against."""
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def ptok(model_dir, tmp_path_factory):
    """The sampler's tokenizer, as a run reads it: from the cache (the tokenizers library)."""
    cache = tmp_path_factory.mktemp("cache")
    load_tokenizer(model_dir, cache)
    t = load_tokenizer(model_dir, cache)
    assert t.source == "cache"
    return t


def test_length_bounds():
    assert length_bounds(100, 0.8, "inferencex") == (80, 100)
    assert length_bounds(100, 1.0, "inferencex") == (100, 100)
    assert length_bounds(100, 0.0, "inferencex") == (1, 100)  # never 0 tokens
    assert length_bounds(100, 0.25, "vllm") == (75, 125)
    assert length_bounds(10, 0.33, "vllm") == (6, 14)  # floor / ceil
    assert length_bounds(100, 0.0, "vllm") == (100, 100)


@pytest.mark.parametrize(
    ("convention", "ratio", "in_bounds", "out_bounds"),
    [
        ("inferencex", 0.5, (48, 96), (8, 16)),
        ("vllm", 0.25, (72, 120), (12, 20)),
        ("inferencex", 1.0, (96, 96), (16, 16)),
    ],
)
def test_exact_prompt_lengths(tok, ptok, convention, ratio, in_bounds, out_bounds):
    reqs = sample_requests(ptok, 60, 96, 16, ratio, convention, np.random.default_rng(1))
    special = set(tok.all_special_ids) | set(tok.get_added_vocab().values())
    for r in reqs:
        ids = tok(r.prompt).input_ids
        assert len(ids) == r.prompt_len
        assert not special & set(ids)
        assert in_bounds[0] <= r.prompt_len <= in_bounds[1]
        assert out_bounds[0] <= r.output_len <= out_bounds[1]
    if in_bounds[0] != in_bounds[1]:  # lengths really vary across the range
        assert len({r.prompt_len for r in reqs}) > 5


def test_reproducible_with_seed(ptok):
    def sample(seed):
        return sample_requests(ptok, 8, 64, 8, 0.5, "inferencex", np.random.default_rng(seed))

    assert sample(7) == sample(7)
    assert [r.prompt for r in sample(7)] != [r.prompt for r in sample(8)]


def _cfg(**kw):
    base = dict(
        base_url="http://127.0.0.1:1",
        model="m",
        tokenizer="t",
        isl=8,
        osl=8,
        concurrency=[1],
        result_dir="r",
        prefill_gpus=1,
        decode_gpus=1,
    )
    return ClientConfig(**(base | kw))


def test_config_defaults_and_validation():
    cfg = _cfg(concurrency=[1, 4])
    assert cfg.url == "http://127.0.0.1:1/v1/completions"
    assert cfg.num_prompts_for(1) == 16 and cfg.num_prompts_for(4) == 40
    assert cfg.num_warmups_for(4) == 8
    assert _cfg(endpoint="chat").url.endswith("/v1/chat/completions")
    assert ClientConfig.model_validate_json(cfg.model_dump_json()) == cfg  # inf survives JSON
    for bad in (
        dict(range_ratio_convention="vllm"),
        dict(concurrency=[2, 2]),
        dict(isl=0),
        dict(unknown=1),
        dict(base_url="127.0.0.1:1"),
        dict(range_ratio=1.5),
    ):
        with pytest.raises(ValidationError):
            _cfg(**bad)


def test_shared_prefix_is_exact_and_shared(tok, ptok):
    from harness.bench.dataset import make_prefix

    prefix = make_prefix(ptok, 40, np.random.default_rng(3))
    pids = tok.encode(prefix, add_special_tokens=False)
    assert len(pids) == 40 and make_prefix(ptok, 0, np.random.default_rng(3)) == ""
    reqs = sample_requests(ptok, 30, 64, 8, 0.5, "inferencex", np.random.default_rng(4), prefix=prefix, prefix_len=40)
    n_special = tok.num_special_tokens_to_add()
    for r in reqs:
        ids = tok(r.prompt).input_ids
        assert len(ids) == r.prompt_len and 40 + 32 <= r.prompt_len <= 40 + 64
        assert ids[n_special : n_special + 40] == pids and r.prompt.startswith(prefix)


def test_prompt_files(tok, ptok, tmp_path):
    from harness.bench.dataset import DatasetError, load_records, sample_file_requests

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "one two", "output_len": 5}\n{"prompt": "three"}\n')
    recs = load_records(f, "jsonl")
    reqs = sample_file_requests(ptok, recs, 5, 9, np.random.default_rng(0))  # cycles through the 2 records
    assert sorted((r.prompt, r.output_len) for r in reqs[:2]) == [("one two", 5), ("three", 9)]
    assert len(reqs) == 5 and all(r.prompt_len == len(tok(r.prompt).input_ids) for r in reqs)
    assert reqs == sample_file_requests(ptok, recs, 5, 9, np.random.default_rng(0))  # seeded

    for text, msg in [
        ('{"prompt": 3}', ":1: needs a non-empty string 'prompt'"),
        ("{oops", ":1: not JSON"),
        ('{"prompt": "a", "output_len": 0}', "'output_len' must be a positive integer"),
        ("", "no usable"),
    ]:
        f.write_text(text)
        with pytest.raises(DatasetError, match=msg):
            load_records(f, "jsonl")

    g = tmp_path / "s.json"
    long_reply = " ".join(["word"] * 3000)  # outside vLLM's length filter: skipped
    g.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "human", "value": "what is a fox"},
                        {"from": "gpt", "value": "a small wild dog"},
                    ]
                },
                {"conversations": [{"from": "human", "value": "and a dog?"}]},
                {"conversations": [{"from": "human", "value": "say a lot"}, {"from": "gpt", "value": long_reply}]},
            ]
        )
    )
    recs = load_records(g, "sharegpt")
    assert len(recs) == 2
    reqs = sample_file_requests(ptok, recs, 3, 9, np.random.default_rng(1))
    assert {r.prompt for r in reqs} == {"what is a fox"}
    assert all(r.output_len == len(tok("a small wild dog").input_ids) for r in reqs)
    g.write_text(json.dumps([{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]}]))
    with pytest.raises(DatasetError, match="length filter"):
        sample_file_requests(ptok, load_records(g, "sharegpt"), 1, 9, np.random.default_rng(1))


def test_config_dataset_and_new_fields():
    assert _cfg().dataset == "random" and _cfg().health_check_interval_s == 2.0 and _cfg().burstiness == 1.0
    assert _cfg(dataset="jsonl", dataset_path="p.jsonl").dataset_path == "p.jsonl"
    assert _cfg(goodput={"ttft": "500"}).goodput == {"ttft": 500.0}
    assert _cfg(burstiness="inf").burstiness == float("inf")
    for bad in (
        dict(dataset="jsonl"),
        dict(dataset_path="x"),
        dict(goodput={"queue": 1}),
        dict(goodput={"ttft": -1}),
        dict(burstiness=0),
        dict(server_pids=[0]),
        dict(progress="fancy"),
    ):
        with pytest.raises(ValidationError):
            _cfg(**bad)


@pytest.mark.parametrize("add_bos", [None, True, False])
def test_prompt_tokenizer_counts_as_the_server_does(tmp_path, add_bos):
    """Encode, the count with special tokens, the special-token count and the ids a prompt may
    use are transformers' (what vLLM's server counts), built through transformers the first
    time and read from the cache (tokenizers alone) the next; a change to the tokenizer's
    files is a new cache entry, a damaged entry is rebuilt."""
    model = tiny_model.build(tmp_path / "m")
    cfg_file = model / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.pop("add_bos_token", None)
    if add_bos is not None:
        cfg["add_bos_token"] = add_bos
    cfg_file.write_text(json.dumps(cfg))
    hf = AutoTokenizer.from_pretrained(str(model))
    cache = tmp_path / "cache"
    built = load_tokenizer(str(model), cache)
    read = load_tokenizer(str(model), cache)
    assert (built.source, read.source) == ("transformers", "cache")
    texts = ["hello world", "the quick brown fox jumps over the lazy dog " * 5, "<|pad|> a b"]
    banned = set(hf.all_special_ids) | set(hf.get_added_vocab().values())
    want = [i for i in range(hf.vocab_size) if i not in banned]
    for ours in (built, read):
        for text in texts:
            assert ours.encode(text) == hf.encode(text, add_special_tokens=False)
            assert ours.count(text) == len(hf(text).input_ids)
            assert ours.decode(ours.encode(text)) == hf.decode(hf.encode(text, add_special_tokens=False))
        assert ours.num_special == hf.num_special_tokens_to_add()
        assert ours.allowed_ids().tolist() == want
    (entry,) = (cache / "tokenizers").iterdir()
    cfg["model_max_length"] = 2048
    cfg_file.write_text(json.dumps(cfg))
    assert load_tokenizer(str(model), cache).source == "transformers"  # new files, new entry
    assert len(list((cache / "tokenizers").iterdir())) == 2
    entry.write_text("{not json")
    cfg["model_max_length"] = 4096
    cfg_file.write_text(json.dumps(cfg))
    assert load_tokenizer(str(model), cache).source == "transformers"  # rebuilt
    assert load_tokenizer(str(model), cache).source == "cache"


def test_joined_words_are_the_checked_prompts(ptok):
    """The join of whole-word texts (no encode) gives the very prompts decode + encode gives."""
    assert ptok.word_texts() is not None  # the tiny model's byte-level BPE is proven joinable
    fast = sample_requests(ptok, 20, 200, 8, 1.0, "inferencex", np.random.default_rng(3))
    ptok._word_texts = None  # as for a tokenizer that failed the proof: the checked path
    ptok._joinable = False
    try:
        checked = sample_requests(ptok, 20, 200, 8, 1.0, "inferencex", np.random.default_rng(3))
    finally:
        ptok._joinable = None
    assert fast == checked


def test_a_tokenizer_that_merges_across_words_is_not_joined():
    """BPE without a pre-tokenizer learns merges across spaces (" cd ef" one token): the
    words alone round-trip, a run of them does not, so prompts take the checked path."""
    from tokenizers import Tokenizer, decoders, models, trainers

    from harness.bench.tokenizer import PromptTokenizer

    backend = Tokenizer(models.BPE(unk_token=None))
    backend.decoder = decoders.Fuse()
    corpus = [" ab cd ef gh" * 200, " ab ef cd gh" * 3, *(f" {w}" * 3 for w in ("ab", "cd", "ef", "gh"))]
    backend.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=60, show_progress=False))
    tok = PromptTokenizer(backend, set(), backend.get_vocab_size(), "test")
    assert " cd ef" in backend.get_vocab()  # merged across the space
    assert {" ab", " cd", " ef", " gh"} <= {backend.id_to_token(int(i)) for i in tok.word_ids()}
    assert tok.word_texts() is None
