"""`pdbench bench` takes what `vllm bench serve` users reach for, under vLLM's names: sampling
(--temperature, --top-p, --top-k, --ignore-eos), --header KEY=VALUE, and the API key from
OPENAI_API_KEY (or the variable --api-key-env names). Every request carries them; each result
records the sampling and the headers' names, and no file or log holds a header's value or the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bench_fake_server import FakeServer

from harness import tiny_model

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
KEY, SECRET = "sk-test-7f3a91", "hush-0c55e2"


def _bench(model: str, url: str, results: Path, *flags: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "harness", "bench", "--base-url", url, "--model", model),
            *("--isl", "16", "--osl", "4", "--concurrency", "2", "--num-prompts", "6", "--num-warmups", "2"),
            *("--results-dir", str(results), "--workers", "1", "--progress", "plain", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=REPO,
        env=os.environ | {"COLUMNS": "120"} | env,
    )


def test_sampling_headers_and_the_api_key_reach_every_request_and_no_file(tmp_path: Path) -> None:
    model = str(tiny_model.build(tmp_path / "m"))
    results = tmp_path / "r"
    flags = ("--temperature", "0.7", "--top-p", "0.9", "--top-k", "20", "--no-ignore-eos")
    flags += ("--header", "X-Team=bench", "--header", f"X-Secret={SECRET}")
    with FakeServer() as srv:
        r = _bench(model, srv.base_url, results, *flags, env={"OPENAI_API_KEY": KEY})
        bodies, headers = list(srv.bodies), list(srv.headers)
    assert r.returncode == 0, r.stdout + r.stderr
    # Precondition: the warm-ups and measured requests (and any sentinel) reached the server.
    load = [b for b in bodies if not b.get("return_token_ids")]
    assert len(load) == 2 + 6, len(load)
    for b in load:
        assert (b["temperature"], b["top_p"], b["top_k"], b["ignore_eos"]) == (0.7, 0.9, 20, False), b
    for b in bodies:
        if b.get("return_token_ids"):  # a sentinel compares answers: it stays greedy and seeded
            assert b["temperature"] == 0 and "top_p" not in b, b
    for h in headers:
        assert h["Authorization"] == f"Bearer {KEY}" and h["X-Team"] == "bench" and h["X-Secret"] == SECRET, h

    (path,) = results.glob("*.json")
    options = json.loads(path.read_text())["metadata"]["request_options"]
    assert options == {
        "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 20},
        "ignore_eos": False,
        "headers": ["Authorization", "X-Secret", "X-Team"],
        "api_key": "$OPENAI_API_KEY",
    }, options
    # Neither the key nor a header's value is in any file the bench wrote, nor in its output.
    written = [p for p in results.rglob("*") if p.is_file()]
    assert written and not [p for p in written if KEY in p.read_text() or SECRET in p.read_text()]
    assert KEY not in r.stdout + r.stderr and SECRET not in r.stdout + r.stderr


def test_without_options_requests_stay_greedy_and_bare(tmp_path: Path) -> None:
    model = str(tiny_model.build(tmp_path / "m"))
    with FakeServer() as srv:
        r = _bench(
            model, srv.base_url, tmp_path / "r", "--api-key-env", "PDBENCH_TEST_KEY", env={"OPENAI_API_KEY": KEY}
        )
        bodies, headers = list(srv.bodies), list(srv.headers)
    assert r.returncode == 0, r.stdout + r.stderr
    assert bodies and all(b["temperature"] == 0 and "top_p" not in b and b["ignore_eos"] for b in bodies)
    assert not [h for h in headers if "Authorization" in h]  # the key is read from the variable named only
    (path,) = (tmp_path / "r").glob("*.json")
    options = json.loads(path.read_text())["metadata"]["request_options"]
    assert options == {"sampling": {"temperature": 0}, "ignore_eos": True, "headers": [], "api_key": None}


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (("--header", "Host=evil"), "header: Value error, Host: the client sets this header itself"),
        (("--header", "X-Team"), "header: Value error, 'X-Team': expected KEY=VALUE"),
        (("--top-p", "0"), "top_p: Input should be greater than 0"),
        (("--top-k", "-2"), "top_k: Input should be greater than or equal to -1"),
        (("--temperature", "-1"), "temperature: Input should be greater than or equal to 0"),
    ],
)
def test_a_bad_option_is_refused_before_any_request(tmp_path: Path, flags: tuple[str, ...], needle: str) -> None:
    with FakeServer() as srv:
        r = _bench("unused", srv.base_url, tmp_path / "r", *flags, env={})
        sent = len(srv.bodies)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert sent == 0
