"""Several ISL/OSL shapes in one sweep, and resuming a sweep that was cut short."""

from __future__ import annotations

import json

import pytest
from helpers.bench_configs import sweep_config
from helpers.bench_fake_server import FakeServer
from pydantic import ValidationError
from transformers import AutoTokenizer

from harness import tiny_model
from harness.bench import ClientConfig, run_sweep_detailed
from harness.bench.bench_command import load_config
from harness.config.benchmark import BenchmarkSettings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


SHAPES = [{"isl": 24, "osl": 3}, {"isl": 40, "osl": 5, "range_ratio": 0.5}]


def _shapes_cfg(model_dir, tmp_path, url, **kw):
    return sweep_config(model_dir, tmp_path, url, isl=None, osl=None, shapes=SHAPES, num_warmups=1, **kw)


def test_each_shape_gets_its_own_sweep_files_and_prompts(model_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(model_dir)
    with FakeServer() as srv:
        outcomes = run_sweep_detailed(_shapes_cfg(model_dir, tmp_path, srv.base_url))
        bodies = list(srv.bodies)
    assert [(o.shape, o.concurrency, o.ok) for o in outcomes] == [
        ("isl_24_osl_3", 1, True),
        ("isl_24_osl_3", 2, True),
        ("isl_40_osl_5", 1, True),
        ("isl_40_osl_5", 2, True),
    ]
    names = sorted(p.name for p in tmp_path.glob("concurrency_*.json"))
    assert names == [
        "concurrency_1_req_rate_inf_isl_24_osl_3_gpus_3_ctx_1_gen_2.json",
        "concurrency_1_req_rate_inf_isl_40_osl_5_gpus_3_ctx_1_gen_2.json",
        "concurrency_2_req_rate_inf_isl_24_osl_3_gpus_3_ctx_1_gen_2.json",
        "concurrency_2_req_rate_inf_isl_40_osl_5_gpus_3_ctx_1_gen_2.json",
    ]
    for o in outcomes:
        r = json.loads(o.path.read_text())
        isl, osl = (24, 3) if o.shape == "isl_24_osl_3" else (40, 5)
        assert (r["random_input_len"], r["random_output_len"], r["max_concurrency"]) == (isl, osl, o.concurrency)
        assert r["range_ratio"] == (1.0 if isl == 24 else 0.5)
        if isl == 24:  # ratio 1: every prompt exactly isl tokens
            assert set(r["input_lens"]) == {24}
        else:  # inferencex convention: [r*len, len]
            assert all(20 <= n <= 40 for n in r["input_lens"])
    # The shapes ran in order, and no prompt repeats across shapes or points (prefix cache).
    lens = [len(tok.encode(b["prompt"], add_special_tokens=False)) for b in bodies]
    assert all(n == 24 for n in lens[: len(lens) // 2 - 1])
    assert len({b["prompt"][:40] for b in bodies}) == len(bodies)


def test_shape_settings_are_checked():
    base = {"concurrency": [1]}
    with pytest.raises(ValidationError, match=r"give isl and osl \(one shape\), or shapes"):
        BenchmarkSettings(**base)
    with pytest.raises(ValidationError, match="not both"):
        BenchmarkSettings(**base, isl=1, osl=1, shapes=["2x2"])
    with pytest.raises(ValidationError, match="repeated: isl_8_osl_8"):
        BenchmarkSettings(**base, shapes=["8x8", {"isl": 8, "osl": 8, "range_ratio": 0.5}])
    with pytest.raises(ValidationError, match=r"shapes.1.range_ratio must be in \[0, 1\)"):
        BenchmarkSettings(**base, shapes=["8x8", "9x9x1.0"], range_ratio=0.0, range_ratio_convention="vllm")
    with pytest.raises(ValidationError, match="expected ISLxOSL"):
        BenchmarkSettings(**base, shapes=["1024"])
    s = BenchmarkSettings(**base, shapes=["1024x1024", "8192x1024x0.8"], range_ratio=0.9)
    assert [(x.isl, x.osl, x.range_ratio) for x in s.shape_list()] == [(1024, 1024, 0.9), (8192, 1024, 0.8)]


def test_cli_takes_shapes_as_text(model_dir, tmp_path):
    cfg = load_config(
        None,
        {
            "base_url": "http://x:1",
            "model": "m",
            "tokenizer": model_dir,
            "result_dir": str(tmp_path),
            "concurrency": ["1"],
            "shapes": ["1024x128", "128x1024x0.5"],
        },
    )
    assert isinstance(cfg, ClientConfig) and [s.tag for s in cfg.shape_list()] == [
        "isl_1024_osl_128",
        "isl_128_osl_1024",
    ]


def test_resume_runs_only_the_points_not_done(model_dir, tmp_path):
    # First run: 4 points of 1 warmup + 2 requests; the last (shape 2, C=2) has its requests fail.
    fail_last = lambda n, body: "500" if n >= 10 else None  # the last point's measured requests  # noqa: E731
    with FakeServer(policy=fail_last) as srv:
        first = run_sweep_detailed(_shapes_cfg(model_dir, tmp_path, srv.base_url, num_prompts=2))
    assert [o.ok for o in first] == [True, True, True, False]
    done = {o.path.name: o.path.read_bytes() for o in first[:3]}
    partial = first[3].path
    partial_bytes = partial.read_bytes()

    # Without resume, nothing is sent.
    with FakeServer() as srv:
        with pytest.raises(Exception, match="already exist"):
            run_sweep_detailed(_shapes_cfg(model_dir, tmp_path, srv.base_url, num_prompts=2))
        assert srv.bodies == []

    with FakeServer() as srv:
        second = run_sweep_detailed(_shapes_cfg(model_dir, tmp_path, srv.base_url, num_prompts=2, resume=True))
        sent = len(srv.bodies)
    assert [(o.kept, o.ok) for o in second] == [(True, True), (True, True), (True, True), (False, True)]
    assert sent == 2 + 1  # one point: its requests and its warmup
    assert {n: (tmp_path / n).read_bytes() for n in done} == done  # kept as they were
    r = json.loads(partial.read_text())
    assert (r["completed"], r["failed"]) == (2, 0)
    # The cut-short file was moved, not overwritten.
    assert (tmp_path / "superseded" / partial.name).read_bytes() == partial_bytes


def test_resume_reruns_a_point_made_with_other_settings(model_dir, tmp_path):
    with FakeServer() as srv:
        run_sweep_detailed(sweep_config(model_dir, tmp_path, srv.base_url, concurrency=[1], num_prompts=2))
    with FakeServer() as srv:
        (o,) = run_sweep_detailed(
            sweep_config(model_dir, tmp_path, srv.base_url, concurrency=[1], num_prompts=3, resume=True)
        )
        assert len(srv.bodies) == 3 + 2
    assert not o.kept and json.loads(o.path.read_text())["num_prompts"] == 3
    assert len(list((tmp_path / "superseded").iterdir())) == 1
