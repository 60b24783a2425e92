"""Multi-turn sessions run by a job on real vLLM (local launcher, 1P1D tiny model, prefix caching on
as vLLM V1's default): every turn after the first re-sends its session's earlier prompt, and
prefill's prefix cache finds it, in the point's saved /metrics and in the result's prefix_cache.
The sessions are the `sessions` workload of the session's shared job (helpers/shared_jobs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.shared_jobs import SESSIONS, SESSIONS_CONCURRENCY, TURNS

from harness.validity.series import Scrape, delta

pytestmark = pytest.mark.vllm

CONCURRENCY = SESSIONS_CONCURRENCY
# vLLM's CPU backend caches prompts in blocks of this many tokens; a prefill instance keeps every
# full block of a prompt it computed, so turn k finds turn k-1's full blocks there.
BLOCK = 128


def _delta(metrics: Path, server: str, family: str) -> float:
    scrape = lambda phase: Scrape.parse((metrics / f"{server}.{phase}.prom").read_text())  # noqa: E731
    found = delta(scrape("before"), scrape("after"), family)
    assert found is not None, f"{server} exports no {family}"
    return found[0]


def test_later_turns_hit_prefills_prefix_cache(workloads_job: Path) -> None:
    where = workloads_job / "workloads" / "sessions"
    (f,) = where.glob(f"concurrency_{CONCURRENCY}_*.json")
    r = json.loads(f.read_text())
    assert r["metadata"]["workload"] == "sessions" and r["metadata"]["valid"] is True
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
    metrics = where / "metrics" / f"concurrency_{CONCURRENCY}"
    hits = _delta(metrics, "prefill-0", "vllm:prefix_cache_hits_total")
    queries = _delta(metrics, "prefill-0", "vllm:prefix_cache_queries_total")
    # At least the sessions' re-sent blocks (a sentinel whose reference prefill answered before
    # may hit too), and never more than was asked.
    assert expected <= hits <= queries, (expected, hits, queries)
    prefill = r["prefix_cache"]["roles"]["prefill"]
    assert (prefill["hits"], prefill["queries"]) == (hits, queries)
    assert r["prefix_cache"]["enabled"] is True
