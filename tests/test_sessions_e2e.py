"""Multi-turn sessions run by a job on real vLLM (local launcher, 1P1D tiny model, prefix caching on
as vLLM V1's default): every turn after the first re-sends its session's earlier prompt, and
prefill's prefix cache finds it, in the point's saved /metrics and in the result's prefix_cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import require_vllm
from helpers import tokenizer_cache
from helpers.e2e_jobs import SKIP_FLAG_CHECK

from harness.validity.series import Scrape, delta

pytestmark = pytest.mark.vllm

RECIPE = "tiny-fp32-cpu-nixl-1p1d"
PORTS = {8100, 8200, 30000, 5600, 5601}
SESSIONS, TURNS, CONCURRENCY = 4, 3, 2
# vLLM's CPU backend caches prompts in blocks of this many tokens; a prefill instance keeps every
# full block of a prompt it computed, so turn k finds turn k-1's full blocks there.
BLOCK = 128


def _listening() -> set[int]:
    return {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN} & PORTS


def _delta(metrics: Path, server: str, family: str) -> float:
    scrape = lambda phase: Scrape.parse((metrics / f"{server}.{phase}.prom").read_text())  # noqa: E731
    found = delta(scrape("before"), scrape("after"), family)
    assert found is not None, f"{server} exports no {family}"
    return found[0]


def test_later_turns_hit_prefills_prefix_cache(tmp_path: Path) -> None:
    require_vllm()
    assert not _listening(), f"ports already in use: {_listening()}"
    results = tmp_path / "results"
    overrides = [
        "benchmark.dataset=sessions",
        f"benchmark.concurrency=[{CONCURRENCY}]",
        "benchmark.isl=256",
        "benchmark.osl=4",
        "benchmark.num_warmups=null",
        f"benchmark.sessions.turns={TURNS}",
        "benchmark.sessions.user_tokens=128",
        f"benchmark.sessions.num_sessions={SESSIONS}",
        "benchmark.sessions.num_warmup_sessions=1",
        "benchmark.sessions.think_time_s=0.2",
    ]
    args = [sys.executable, "-m", "harness", "submit", "--recipe", RECIPE, "--launcher", "local", *SKIP_FLAG_CHECK]
    args += ["--results-dir", str(results)]
    tokenizer_cache.seed(results)
    for o in overrides:
        args += ["--set", o]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (run_dir,) = (results / RECIPE).iterdir()
    (f,) = run_dir.glob(f"concurrency_{CONCURRENCY}_*.json")
    r = json.loads(f.read_text())
    n = SESSIONS * TURNS
    assert (r["dataset_name"], r["num_prompts"], r["completed"], r["failed"]) == ("sessions", n, n, 0)

    s = r["sessions"]
    assert (s["turns"], s["sessions_started"], s["sessions_completed"]) == (TURNS, SESSIONS, SESSIONS)
    assert [(t["turn"], t["completed"]) for t in s["by_turn"]] == [(k, SESSIONS) for k in range(1, TURNS + 1)]
    growth = [t["prompt_tokens_mean"] for t in s["by_turn"]]
    assert growth[0] == 256 and growth[0] + 128 < growth[1] and growth[1] + 128 < growth[2]
    # Independent sentinel prompts went beside the sessions and matched the reference.
    assert s["sentinels"].startswith(f"{r['sentinels']['sent']} independent greedy prompts")
    assert r["sentinels"]["matched"] == r["sentinels"]["compared"] > 0

    # What prefill's cache must have found: every later turn's prompt begins with its session's
    # previous prompt, whose full blocks prefill computed and kept (input_lens: session by session).
    lens = r["input_lens"]
    expected = sum(lens[i * TURNS + k - 1] // BLOCK * BLOCK for i in range(SESSIONS) for k in range(1, TURNS))
    assert expected >= SESSIONS * (256 + 384)
    metrics = run_dir / "metrics" / f"concurrency_{CONCURRENCY}"
    hits = _delta(metrics, "prefill-0", "vllm:prefix_cache_hits_total")
    queries = _delta(metrics, "prefill-0", "vllm:prefix_cache_queries_total")
    # At least the sessions' re-sent blocks (a sentinel whose reference prefill answered before
    # may hit too), and never more than was asked.
    assert expected <= hits <= queries, (expected, hits, queries)
    prefill = r["prefix_cache"]["roles"]["prefill"]
    assert (prefill["hits"], prefill["queries"]) == (hits, queries)
    assert r["prefix_cache"]["enabled"] is True
    assert not _listening()
