"""The mock engine: OpenAI-compatible endpoints, latencies, and vLLM's kv_transfer_params legs."""

from __future__ import annotations

import http.client
import itertools
import json
import random
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import typer
from helpers.mock_engine import Engine
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from harness import tiny_model
from harness.bench import ClientConfig, run_sweep_detailed
from harness.mock_engine import Distribution, MockEngineConfig
from harness.mock_engine.engine_command import mock_engine_command

pytestmark = pytest.mark.timeout(60)


def _events(raw: bytes) -> list[Any]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_distribution_specs():
    assert str(Distribution.parse("50")) == "constant:50" and str(Distribution.parse(7)) == "constant:7"
    assert Distribution.parse("normal:10,2") == Distribution("normal", 10, 2)
    assert Distribution.parse("constant:0").is_zero and not Distribution.parse("exponential:1").is_zero
    rng = random.Random(0)
    for spec, mean in [("exponential:10", 10), ("uniform:5,15", 10), ("normal:10,1", 10), ("lognormal:10,3", 10)]:
        d = Distribution.parse(spec)
        samples = [d.sample_s(rng) * 1000 for _ in range(20000)]
        assert sum(samples) / len(samples) == pytest.approx(mean, rel=0.05), spec
        assert min(samples) >= 0
    for bad in ("normal:10", "gauss:1", "constant:-1", "uniform:5,1", "exponential:x", "constant:inf"):
        with pytest.raises(ValueError, match="bad latency distribution"):
            Distribution.parse(bad)
    with pytest.raises(ValueError):
        MockEngineConfig(itl_ms="weird:1")
    assert MockEngineConfig(ttft_ms=50, itl_ms="normal:10,1").ttft_ms == "constant:50"


def test_endpoints_streaming_and_not():
    with Engine(model="m") as eng:
        assert eng.get("/health")[0] == 200
        assert json.loads(eng.get("/v1/models")[1])["data"][0]["id"] == "m"

        status, raw = eng.post(
            "/v1/completions",
            {
                "model": "m",
                "prompt": "a b c",
                "max_tokens": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        ev = _events(raw)
        assert status == 200 and ev[-1] == "[DONE]"
        tokens = [e for e in ev[:-1] if e["choices"]]
        assert len(tokens) == 4 and [t["choices"][0]["finish_reason"] for t in tokens] == [None] * 3 + ["length"]
        assert ev[-2]["choices"] == [] and ev[-2]["usage"] == {
            "prompt_tokens": 3,
            "total_tokens": 7,
            "completion_tokens": 4,
        }
        text = "".join(t["choices"][0]["text"] for t in tokens)
        assert len(text.split()) == 4  # one word per token

        status, raw = eng.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "stream": True})
        ev = _events(raw)
        assert len(ev) == 3 and all("usage" not in e for e in ev[:-1])  # no usage chunk unless asked

        ev = _events(
            eng.post(
                "/v1/chat/completions",
                {
                    "messages": [{"role": "user", "content": "hi there"}],
                    "max_completion_tokens": 2,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )[1]
        )
        assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert [e["choices"][0]["delta"]["content"] for e in ev[1:3]] == [" the", " quick"]
        assert ev[3]["usage"]["prompt_tokens"] == 2 and ev[0]["object"] == "chat.completion.chunk"

        body = json.loads(eng.post("/v1/completions", {"prompt": [1, 2, 3, 4, 5], "max_tokens": 3})[1])
        assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3}
        assert body["choices"][0]["text"] == " the quick brown" and body["kv_transfer_params"] is None
        chat = json.loads(eng.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "a b"}]})[1])
        assert chat["choices"][0]["message"]["content"].split() == [
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "a",
            "lazy",
            "dog",
            "again",
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
        ]  # default 16

        m = eng.metrics()
        assert m["vllm:prompt_tokens_total"] == 3 + 1 + 2 + 5 + 2
        assert m["vllm:generation_tokens_total"] == 4 + 2 + 2 + 3 + 16
        assert m["vllm:request_success_total/length"] == 5 and m["vllm:num_requests_running"] == 0


def test_errors_eos_and_limits():
    with Engine(model="m", eos_after=2, max_model_len=10) as eng:
        status, raw = eng.post("/v1/completions", {"model": "other", "prompt": "x"})
        assert status == 404 and "does not exist" in json.loads(raw)["error"]["message"]
        status, raw = eng.post("/v1/completions", {"prompt": "a b c d e f", "max_tokens": 5})
        assert status == 400 and "maximum context length is 10" in json.loads(raw)["error"]["message"]
        assert eng.post("/v1/completions", {"prompt": "x", "max_tokens": 0})[0] == 400
        assert eng.post("/v1/completions", {"prompt": {"bad": 1}})[0] == 400
        req = urllib.request.Request(eng.url + "/v1/completions", data=b"{not json")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400
        stop = json.loads(eng.post("/v1/completions", {"prompt": "x", "max_tokens": 5})[1])
        assert stop["usage"]["completion_tokens"] == 2 and stop["choices"][0]["finish_reason"] == "stop"
        full = json.loads(eng.post("/v1/completions", {"prompt": "x", "max_tokens": 5, "ignore_eos": True})[1])
        assert full["usage"]["completion_tokens"] == 5 and full["choices"][0]["finish_reason"] == "length"
        assert eng.metrics()["vllm:request_success_total/stop"] == 1


def test_tokenizer_counts(tmp_path):
    from transformers import AutoTokenizer

    model = str(tiny_model.build(tmp_path / "m"))
    tok = AutoTokenizer.from_pretrained(model)
    prompt = "the quick brown fox, jumping over 123 lazy dogs!"
    with Engine(tokenizer=model) as eng:
        body = json.loads(eng.post("/v1/completions", {"prompt": prompt, "max_tokens": 1})[1])
        assert body["usage"]["prompt_tokens"] == len(tok(prompt).input_ids)
        msgs = [{"role": "user", "content": prompt}]
        chat = json.loads(eng.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1})[1])
        # The templated text, encoded as it stands (the template writes any BOS itself).
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        expected = len(tok(text, add_special_tokens=False).input_ids)
        assert expected > len(tok(prompt).input_ids)  # the template adds tokens around the prompt
        assert chat["usage"]["prompt_tokens"] == expected


PREFILL_LEG = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
PROMPT = " ".join(f"w{i}" for i in range(40))  # 40 tokens: 3 blocks of 16


def test_prefill_and_decode_roles():
    with (
        Engine(role="prefill", engine_id="eng-p", kv_host="10.0.0.7", kv_port=5601) as p,
        Engine(role="decode", itl_ms=1) as d,
    ):
        status, raw = p.post(
            "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "stream": False, "kv_transfer_params": PREFILL_LEG}
        )
        body = json.loads(raw)
        kv = body["kv_transfer_params"]
        assert status == 200 and body["usage"]["completion_tokens"] == 1
        assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
        assert (kv["remote_engine_id"], kv["remote_host"], kv["remote_port"]) == ("eng-p", "10.0.0.7", 5601)
        assert kv["remote_block_ids"] == [[0, 1, 2]] and kv["remote_num_tokens"] == 40
        assert kv["remote_request_id"] == body["id"]
        again = json.loads(
            p.post("/v1/completions", {"prompt": "a b", "max_tokens": 1, "kv_transfer_params": PREFILL_LEG})[1]
        )
        assert again["kv_transfer_params"]["remote_block_ids"] == [[3]]  # blocks are not reused

        # The decode leg carries the prefill's params: its prompt counts as external hits.
        status, raw = d.post(
            "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "stream": True, "kv_transfer_params": kv}
        )
        assert status == 200 and _events(raw)[-1] == "[DONE]"
        m = d.metrics()
        assert m["vllm:external_prefix_cache_hits_total"] == 40 and m["vllm:prompt_tokens_total"] == 40
        # Without the remote fields, vLLM recomputes: no hits.
        d.post(
            "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_prefill": True}}
        )
        assert d.metrics()["vllm:external_prefix_cache_hits_total"] == 40
        assert p.metrics()["vllm:external_prefix_cache_hits_total"] == 0
        # vLLM's prompt_tokens_by_source: the loaded prompt and the recomputed one, on decode.
        by_source = {
            s.labels["source"]: s.value
            for f in text_string_to_metric_families(d.get("/metrics")[1].decode())
            for s in f.samples
            if s.name == "vllm:prompt_tokens_by_source_total"
        }
        assert by_source == {"local_compute": 40, "local_cache_hit": 0, "external_kv_transfer": 40}

        # Each role rejects the other's leg, and serves plain requests.
        status, raw = p.post("/v1/completions", {"prompt": "x", "kv_transfer_params": kv})
        assert status == 400 and "prefill instance" in json.loads(raw)["error"]["message"]
        status, raw = d.post("/v1/completions", {"prompt": "x", "kv_transfer_params": PREFILL_LEG})
        assert status == 400 and "decode instance" in json.loads(raw)["error"]["message"]
        assert p.post("/v1/completions", {"prompt": "x"})[0] == d.post("/v1/completions", {"prompt": "x"})[0] == 200


def test_role_both_serves_both_legs():
    with Engine() as eng:
        kv = json.loads(
            eng.post(
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1, "kv_transfer_params": PREFILL_LEG},
            )[1]
        )
        assert kv["kv_transfer_params"]["do_remote_prefill"] is True
        status, _ = eng.post(
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 2,
                "kv_transfer_params": kv["kv_transfer_params"],
            },
        )
        assert status == 200 and eng.metrics()["vllm:external_prefix_cache_hits_total"] == 40


def _stream_times(url: str, body: dict[str, Any]) -> list[float]:
    """Seconds from sending to each SSE token event."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    times = []
    while line := resp.readline():
        if line.startswith(b"data: {"):
            times.append(time.perf_counter() - t0)
    conn.close()
    return times


def test_latencies_are_injected():
    # Two-sided: the mock engine is the yardstick of the client's own timing, so its TTFT and
    # its gap between tokens must be what was asked, not only at least that. Medians over 3
    # streams and 20 gaps each keep a busy machine's hiccups out; a TTFT or a gap doubled, or
    # a gap halved, breaks a bound.
    with Engine(ttft_ms=60, itl_ms=15) as eng:
        streams = [_stream_times(eng.url, {"prompt": "x", "max_tokens": 21, "stream": True}) for _ in range(3)]
    assert [len(t) for t in streams] == [21, 21, 21]
    ttft = float(np.median([t[0] for t in streams]))
    gap = float(np.median([b - a for t in streams for a, b in itertools.pairwise(t)]))
    assert 0.058 <= ttft <= 0.09, ttft
    assert 0.0135 <= gap <= 0.0215, gap
    with Engine(ttft_ms=200, itl_ms=1, role="decode") as eng:  # a decode leg skips the prefill (TTFT)
        kv = {
            "do_remote_prefill": True,
            "remote_engine_id": "e",
            "remote_block_ids": [[0]],
            "remote_host": "h",
            "remote_port": 1,
        }
        times = _stream_times(eng.url, {"prompt": "x", "max_tokens": 2, "stream": True, "kv_transfer_params": kv})
    assert times[0] < 0.15


def test_pdbench_bench_against_the_mock_engine(tmp_path):
    model = str(tiny_model.build(tmp_path / "m"))
    with Engine(model="tiny", ttft_ms=5, itl_ms=2) as eng:
        for endpoint in ("completions", "chat"):
            cfg = ClientConfig(
                base_url=eng.url,
                endpoint=endpoint,
                model="tiny",
                tokenizer=model,
                isl=32,
                osl=8,
                concurrency=[4],
                num_prompts=12,
                result_dir=str(tmp_path / endpoint),
                gpus=1,
            )  # one aggregated engine
            (out,) = run_sweep_detailed(cfg)
            r = json.loads(out.path.read_text())
            assert out.ok and r["output_lens"] == [8] * 12 and all(len(i) == 7 for i in r["itls"])
            assert 5 <= r["median_ttft_ms"] < 100 and 1.5 <= r["median_tpot_ms"] < 20


def test_cli_rejects_bad_options():
    app = typer.Typer()
    app.command()(mock_engine_command)
    runner = CliRunner()
    for args, needle in [
        (["--ttft-ms", "normal:1"], "ttft_ms"),
        (["--role", "router"], "role"),
        (["--port", "70000"], "port"),
    ]:
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and needle in res.output, res.output


def test_emission_lateness_is_recorded_and_reset():
    """The engine's own error (how late each write left against its due time), so a client
    benchmark can separate it from the client's: counted per first token and later token."""
    with Engine(ttft_ms=20, itl_ms=5) as eng:
        for _ in range(3):
            _stream_times(eng.url, {"prompt": "x", "max_tokens": 4, "stream": True})
        stats = json.loads(eng.get("/mock/emissions?reset=1")[1])
        # (tokens already due when a write leaves go in that write: at most 3 later writes each)
        assert stats["first_token_late_ms"]["count"] == 3 and 1 <= stats["later_tokens_late_ms"]["count"] <= 9
        for part in stats.values():
            assert -5 < part["median"] <= part["p99"] <= part["max"] < 200
        assert json.loads(eng.get("/mock/emissions")[1])["first_token_late_ms"] == {"count": 0}
