"""End-to-end sweeps against a fake streaming server, through run_sweep and the CLI."""

from __future__ import annotations

import json
import time

import pytest
import typer
from bench_fake_server import FakeServer
from transformers import AutoTokenizer
from typer.testing import CliRunner

from harness import tiny_model
from harness.bench import BenchConfig, run_sweep, run_sweep_detailed
from harness.bench.cli import bench_command
from harness.bench.results import ResultExistsError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


def _cfg(model_dir, result_dir, base_url, **kw):
    base = dict(base_url=base_url, model="tiny", tokenizer=model_dir, isl=32, osl=6,
                concurrency=[1, 2], num_prompts=4, result_dir=str(result_dir),
                prefill_gpus=1, decode_gpus=2, metadata={"recipe": "test"})
    return BenchConfig(**(base | kw))


def _app():
    app = typer.Typer()
    app.command()(bench_command)
    return app


def test_sweep_counts_failures_and_writes_named_files(model_dir, tmp_path):
    # Arrival numbers: C=1 warmups 0-1, measured 2-5; C=2 warmups 6-9, measured 10-13.
    failures = {3: "500", 12: "midstream", 0: "500"}  # 0 is a warmup: not counted
    with FakeServer(policy=lambda n, body: failures.get(n)) as srv:
        cfg = _cfg(model_dir, tmp_path, srv.base_url)
        paths = run_sweep(cfg)
        bodies = list(srv.bodies)

    assert [p.name for p in paths] == [
        "concurrency_1_req_rate_inf_gpus_3_ctx_1_gen_2.json",
        "concurrency_2_req_rate_inf_gpus_3_ctx_1_gen_2.json",
    ]
    assert len(bodies) == 14
    r1, r2 = (json.loads(p.read_text()) for p in paths)
    assert (r1["completed"], r1["failed"]) == (3, 1) and (r2["completed"], r2["failed"]) == (3, 1)
    assert len(r1["errors"]) == 1 and r1["errors"][0].startswith("HTTP 500")
    assert "injected mid-stream failure" in r2["errors"][0]
    assert r1["max_concurrency"] == 1 and r2["max_concurrency"] == 2 and r2["max_concurrent_requests"] <= 2
    assert r1["num_prompts"] == 4 and r1["request_rate"] == "inf" and r1["metadata"] == {"recipe": "test"}
    assert r1["total_output_tokens"] == 3 * 6 and sorted(r1["output_lens"]) == [0, 6, 6, 6]
    assert r1["total_input_tokens"] == 3 * 32 and r1["input_lens"] == [32] * 4
    assert r1["median_tpot_ms"] > 0 and r1["p99.9_itl_ms"] > 0 and r1["duration"] > 0
    assert r1["range_ratio_convention"] == "inferencex" and r1["random_input_len"] == 32

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert all(len(tok(b["prompt"]).input_ids) == 32 for b in bodies)  # exact on the wire
    assert bodies[2] | {"prompt": None} == {
        "model": "tiny", "prompt": None, "max_tokens": 6, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0,
    }
    # Points never reuse prompts (they would hit the prefix cache).
    assert len({b["prompt"] for b in bodies}) == len(bodies)


def test_existing_result_is_not_overwritten(model_dir, tmp_path):
    with FakeServer() as srv:
        cfg = _cfg(model_dir, tmp_path, srv.base_url)
        existing = tmp_path / "concurrency_2_req_rate_inf_gpus_3_ctx_1_gen_2.json"
        existing.write_text("original")
        with pytest.raises(ResultExistsError, match="concurrency_2"):
            run_sweep(cfg)
        assert srv.bodies == []  # refused before sending any load
    assert existing.read_text() == "original"
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing.name]


def test_request_timeout_fails_instead_of_hanging(model_dir, tmp_path):
    with FakeServer(policy=lambda n, b: "hang" if n % 2 else None) as srv:
        cfg = _cfg(model_dir, tmp_path, srv.base_url, concurrency=[2], num_warmups=0,
                   request_timeout_s=0.5)
        t0 = time.monotonic()
        (out,) = run_sweep_detailed(cfg)
        assert time.monotonic() - t0 < 10
    result = json.loads(out.path.read_text())
    assert (result["completed"], result["failed"]) == (2, 2) and not out.ok
    assert all("request_timeout_s=0.5" in e for e in result["errors"])


def test_point_timeout_keeps_finished_requests(model_dir, tmp_path):
    with FakeServer(policy=lambda n, b: "hang" if n == 1 else None) as srv:
        cfg = _cfg(model_dir, tmp_path, srv.base_url, concurrency=[1], num_prompts=3,
                   num_warmups=0, point_timeout_s=1.0)
        t0 = time.monotonic()
        (out,) = run_sweep_detailed(cfg)
        assert time.monotonic() - t0 < 10
    result = json.loads(out.path.read_text())
    # Request 0 finished, 1 hung and was cancelled, 2 never got a slot: both failed.
    assert (result["completed"], result["failed"]) == (1, 2)
    assert all("point timeout" in e for e in result["errors"])


def test_truncated_stream_and_connection_refused_fail(model_dir, tmp_path):
    with FakeServer(policy=lambda n, b: "no_done") as srv:
        (out,) = run_sweep_detailed(_cfg(model_dir, tmp_path / "a", srv.base_url, concurrency=[2], num_warmups=0))
    assert out.failed == 4 and "[DONE]" in json.loads(out.path.read_text())["errors"][0]
    with FakeServer() as srv:
        url = srv.base_url
    (out,) = run_sweep_detailed(_cfg(model_dir, tmp_path / "b", url, concurrency=[1], num_warmups=0))
    assert out.failed == 4 and "Connect" in json.loads(out.path.read_text())["errors"][0]


def test_chat_endpoint_and_poisson_rate(model_dir, tmp_path):
    with FakeServer() as srv:
        cfg = _cfg(model_dir, tmp_path, srv.base_url, endpoint="chat", concurrency=[2], request_rate=200)
        (out,) = run_sweep_detailed(cfg)
        assert all("messages" in b and "prompt" not in b for b in srv.bodies)
    assert out.ok and out.path.name == "concurrency_2_req_rate_200_gpus_3_ctx_1_gen_2.json"
    result = json.loads(out.path.read_text())
    assert result["request_rate"] == 200.0 and result["output_lens"] == [6] * 4
    assert all(len(itl) == 5 for itl in result["itls"])  # role chunk is not a token


def test_cli_exit_codes(model_dir, tmp_path):
    runner = CliRunner()
    with FakeServer(policy=lambda n, b: "500" if n == 5 else None) as srv:
        cfg_file = tmp_path / "bench.json"
        cfg_file.write_text(_cfg(model_dir, tmp_path / "ok", srv.base_url).model_dump_json())
        res = runner.invoke(_app(), ["--config", str(cfg_file), "--concurrency", "1", "--num-warmups", "0"])
        assert res.exit_code == 0, res.output
        assert len(list((tmp_path / "ok").iterdir())) == 1
        # Standalone flags only; request 5 fails -> exit 1, result still written.
        res = runner.invoke(_app(), [
            "--base-url", srv.base_url, "--model", "tiny", "--tokenizer", model_dir, "--isl", "16",
            "--osl", "4", "--concurrency", "1,2", "--num-prompts", "2", "--num-warmups", "0",
            "--result-dir", str(tmp_path / "fail"), "--prefill-gpus", "1", "--decode-gpus", "1",
            "--request-rate", "inf", "--metadata", '{"k": 1}',
        ])
        assert res.exit_code == 1, res.output
        assert len(list((tmp_path / "fail").iterdir())) == 2
        # Re-running into the same directory refuses to overwrite: exit 1.
        res = runner.invoke(_app(), ["--config", str(cfg_file), "--concurrency", "1", "--num-warmups", "0"])
        assert res.exit_code == 1 and "already exist" in res.output

    for args, field in [(["--isl", "-3"], "isl"), (["--concurrency", "1,x"], "concurrency"),
                        (["--range-ratio-convention", "sglang"], "range_ratio_convention")]:
        res = runner.invoke(_app(), ["--config", str(cfg_file), *args])
        assert res.exit_code == 2 and field in res.output, res.output
    cfg_file.write_text(json.dumps(json.loads(cfg_file.read_text()) | {"bogus": 1}))
    res = runner.invoke(_app(), ["--config", str(cfg_file)])
    assert res.exit_code == 2 and "bogus" in res.output
