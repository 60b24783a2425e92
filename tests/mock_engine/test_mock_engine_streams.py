"""The mock engine's per-request record of its streams (GET /mock/emissions?requests=1): what a
client-fidelity benchmark sets each client's own per-request timestamps against."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks.common import free_port, start_mock_engine

pytestmark = pytest.mark.timeout(120)
TTFT_MS, ITL_MS, TOKENS = 40.0, 5.0, 6


def _stream(port: int, headers: dict[str, str]) -> tuple[float, float, float, int]:
    """(sent, first token read, last token read) on perf_counter, and the token events read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = {"model": "m", "prompt": "a b c", "max_tokens": TOKENS, "stream": True}
    sent = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json", **headers})
    resp = conn.getresponse()
    reads = []
    while line := resp.readline():
        if line.startswith(b"data: {"):
            reads.append(time.perf_counter())
    conn.close()
    return sent, reads[0], reads[-1], len(reads)


def _records(port: int, query: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/mock/emissions?{query}", timeout=10) as r:
        return json.loads(r.read())


def test_streams_with_a_request_id_are_recorded_on_the_engines_clock(tmp_path: Path) -> None:
    port = free_port()
    engine = start_mock_engine(
        port, tmp_path / "engine.log", "--model", "m", "--ttft-ms", f"constant:{TTFT_MS:g}",
        "--itl-ms", f"constant:{ITL_MS:g}",
    )  # fmt: skip
    try:
        seen = {
            "vllm-0": _stream(port, {"X-Request-Id": "vllm-0"}),  # what vllm bench serve sends
            "batch-3": _stream(port, {"X-Pdbench-Id": "batch-3"}),  # pdbench bench, proxy timings on
        }
        _stream(port, {})  # no id: no record
        body = _records(port, "requests=1&reset=1")
        after = _records(port, "requests=1")
    finally:
        engine.terminate()
        engine.wait(timeout=30)
    assert all(n == TOKENS for *_, n in seen.values()), seen  # every token arrived, one per event
    recs = {r["id"]: r for r in body["requests"]}
    assert sorted(recs) == sorted(seen)
    for rid, (sent, first, last, _) in seen.items():
        r = recs[rid]
        assert r["tokens"] == TOKENS
        # The engine's own times from the arrival: the first token at the injected TTFT, the last
        # TOKENS - 1 gaps of ITL later (its timers fire a little early, or late on a busy CPU).
        due_last = TTFT_MS + (TOKENS - 1) * ITL_MS
        assert TTFT_MS - 5 <= r["first_ms"] <= r["last_ms"] and due_last - 5 <= r["last_ms"] <= due_last + 150
        # perf_counter is the one monotonic clock of this host for both processes: the request
        # arrived after it was sent, and each write left before the client read it.
        assert sent <= r["arrival_s"] < r["arrival_s"] + r["first_ms"] / 1e3 <= first
        assert r["arrival_s"] + r["last_ms"] / 1e3 <= last
    assert after["requests"] == []  # reset=1 cleared them
