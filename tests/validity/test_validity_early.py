"""A point whose evidence is already bad stops early (validity.early_check_s), its reason in the
result; the sweep then goes on or stops as validity.on_early_invalid says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.mock_engine import Engine

from benchmarks.common import free_ports
from harness import tiny_model
from harness.bench import ClientConfig, run_sweep_detailed, validity_probe
from harness.validity import ServerScrapes, ValidityThresholds, early_reason

pytestmark = pytest.mark.timeout(120)

# 4 waves of 2 requests of 100 tokens, 50 ms apart: 20 s per point when nothing stops it.
ISL, OSL, ITL_MS, N, C = 16, 100, 50, 8, 2
NATURAL_S = N / C * OSL * ITL_MS / 1000


def _sweep(tmp_path: Path, url: str, model: str, validity: dict, concurrency: list[int], scrape: str = ""):
    cfg = ClientConfig(
        base_url=url,
        model="tiny",
        tokenizer=model,
        isl=ISL,
        osl=OSL,
        concurrency=concurrency,
        num_prompts=N,
        num_warmups=0,
        result_dir=str(tmp_path),
        prefill_gpus=1,
        decode_gpus=1,
        kv_connector="nixl",
        health_check_interval_s=0,
        scrape=[f"decode-0=decode@{scrape or url}"],
        validity=validity,
    )
    return run_sweep_detailed(cfg)


def test_decode_that_computes_the_prompt_stops_early_and_the_sweep_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(validity_probe, "SAMPLE_INTERVAL_S", 0.2)
    model = str(tiny_model.build(tmp_path / "m"))
    # Requests straight to a decode instance carry no KV: it computes every prompt itself.
    with Engine(role="decode", model="tiny", itl_ms=ITL_MS) as eng:
        outcomes = _sweep(tmp_path / "r", eng.url, model, {"early_check_s": 1.0}, [2, 3])
    assert [o.concurrency for o in outcomes] == [2, 3]
    for o in outcomes:
        assert o.path is not None, o.error
        r = json.loads(o.path.read_text())
        md = r["metadata"]["validity"]
        assert md["verdict"] == "invalid" and r["metadata"]["valid"] is False
        first = md["rules"][0]
        assert first["name"] == "early_evidence" and first["status"] == "failed"
        assert re.fullmatch(
            r"point stopped after \d+ s: decode computed \d+ of its \d+ prompt tokens itself \(100%\): "
            r"the KV was not transferred",
            first["detail"],
        ), first["detail"]
        assert md["reasons"][0] == f"early_evidence: {first['detail']}"
        assert r["stop_reason"].startswith("invalid point: decode computed")
        # Stopped soon after the check began, far from the point's natural length.
        assert 1.0 <= first["measured"] < 8 and r["duration"] < NATURAL_S / 2, (first["measured"], r["duration"])
        assert r["completed"] < N


def test_stop_sweep_runs_no_more_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validity_probe, "SAMPLE_INTERVAL_S", 0.2)
    model = str(tiny_model.build(tmp_path / "m"))
    with Engine(role="decode", model="tiny", itl_ms=ITL_MS) as eng:
        first, second = _sweep(
            tmp_path / "r", eng.url, model, {"early_check_s": 1.0, "on_early_invalid": "stop_sweep"}, [2, 3]
        )
    assert first.path is not None and json.loads(first.path.read_text())["metadata"]["valid"] is False
    assert second.path is None and second.error is not None
    assert second.error.startswith("not run: validity.on_early_invalid=stop_sweep after C=2: decode computed")


def test_a_point_with_good_evidence_runs_to_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Through pdbench's proxy, decode gets the prefill leg's params and loads every prompt: the
    # checks run from 0.2 s on at every sample, and nothing stops the point.
    monkeypatch.setattr(validity_probe, "SAMPLE_INTERVAL_S", 0.2)
    model = str(tiny_model.build(tmp_path / "m"))
    port = free_ports(1)[0]
    with (
        Engine(role="prefill", model="tiny") as p,
        Engine(role="decode", model="tiny", itl_ms=ITL_MS / 5) as d,
        subprocess.Popen(
            [sys.executable, "-m", "harness", "proxy", "--port", str(port), "--prefill", p.url, "--decode", d.url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ) as proxy,
    ):
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while not _healthy(url):
                assert proxy.poll() is None and time.monotonic() < deadline, "the proxy did not get healthy"
                time.sleep(0.1)
            (o,) = _sweep(tmp_path / "r", url, model, {"early_check_s": 0.2}, [2], scrape=d.url)
        finally:
            proxy.terminate()
            proxy.wait(timeout=10)
    r = json.loads(o.path.read_text())
    v = r["metadata"]["validity"]
    assert r["completed"] == N and r["stop_reason"] is None
    # The precondition of "nothing stopped it": the point lasted past several checks.
    assert r["duration"] > 1.0
    assert not any(x["name"] == "early_evidence" for x in v["rules"])
    assert {x["name"]: x["status"] for x in v["rules"]}["decode_prompt_compute"] == "passed"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _scrape(**counters: float) -> str:
    names = {
        "prompt": "vllm:prompt_tokens_total",
        "gen": "vllm:generation_tokens_total",
        "local": 'vllm:prompt_tokens_by_source_total{source="local_compute"',
        "failed": "vllm:nixl_num_failed_transfers_total",
        "expired": "vllm:nixl_num_kv_expired_reqs_total",
    }
    lines = []
    for key, v in counters.items():
        n = names[key]
        lines.append(f'{n},engine="0"}} {v}' if "{" in n else f'{n}{{engine="0"}} {v}')
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("role", "now", "completed", "expect"),
    [
        ("decode", dict(prompt=512, gen=40, local=0, failed=0), 3, None),
        ("decode", dict(prompt=512, gen=40, local=0, failed=2), 3, "2 failed or expired KV transfer(s)"),
        ("prefill", dict(prompt=512, expired=1), 3, "1 failed or expired KV transfer(s)"),
        ("decode", dict(prompt=512, gen=40, local=500, failed=0), 3, "decode computed 500 of its 512"),
        ("decode", dict(prompt=512, gen=40, local=10, failed=0), 3, None),  # within the 2 % tolerance
        ("decode", dict(prompt=512, gen=0, local=0, failed=0), 3, "3 request(s) completed and decode generated no"),
        ("decode", dict(prompt=512, gen=0, local=0, failed=0), 0, None),  # nothing finished yet: no verdict
    ],
)
def test_early_reason(role: str, now: dict, completed: int, expect: str | None) -> None:
    before = _scrape(**dict.fromkeys(now, 0))
    servers = {"s": ServerScrapes(role=role, before=before, after=_scrape(**now))}
    got = early_reason(servers, completed, ValidityThresholds(), "nixl")
    assert (got is None) if expect is None else (got is not None and got.startswith(expect)), got
