"""bench_proxy's floor target (benchmarks/relay_floor.py), its streamed client and its verdict."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks import bench_proxy
from benchmarks.common import ROOT, free_port, start_mock_engine

pytestmark = pytest.mark.timeout(120)
MOCK_HEADERS = "--model", "mock"


def _request(body: dict) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
    return head.encode() + b"\r\n\r\n" + data


def _exchange(sock: socket.socket, request: bytes) -> bytes:
    """Send one request on a kept-alive connection; the raw response bytes, framing included."""
    sock.sendall(request)
    buf = b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        buf += sock.recv(1 << 16)
        head_end = buf.find(b"\r\n\r\n")
        if head_end < 0:
            continue
        head = buf[:head_end].lower()
        if b"transfer-encoding: chunked" in head:
            if buf.endswith(b"0\r\n\r\n"):
                return buf
        else:
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
            if len(buf) >= head_end + 4 + length:
                return buf
    raise AssertionError(f"no whole response in 10 s: {buf[-200:]!r}")


def _prefill_requests(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(r'vllm:request_success_total\{[^}]*finished_reason="length"[^}]*\} ([0-9.]+)', text)
    assert found, text[:500]
    return float(found.group(1))


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "relay_floor exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"relay_floor not listening on {port} after {timeout_s:g} s")


STREAMED_ANSWER = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"8\r\ndata: 1\n\r\n",
    b"8\r\ndata: 2\n\r\n5\r\ndata:\r\n",  # pieces need not end where events or chunks do
    b"3\r\n 3\n\r\n",
    b"0\r\n\r\n",
]
WHOLE_ANSWER = [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{", b'"a": 1}\n']


def _fake_decode(server: socket.socket, seen: list[bytes]) -> None:
    """One connection: answers each request with the next canned answer, piece by piece."""
    conn, _ = server.accept()
    with conn:
        conn.settimeout(10)
        for answer in (STREAMED_ANSWER, WHOLE_ANSWER):
            buf = b""
            while b"\r\n\r\n" not in buf or len(buf) < buf.index(b"\r\n\r\n") + 4 + int(
                buf.lower().split(b"content-length:")[1].split(b"\r\n")[0]
            ):
                piece = conn.recv(1 << 16)
                if not piece:
                    return
                buf += piece
            seen.append(buf)
            for piece in answer:
                conn.sendall(piece)
                time.sleep(0.01)  # separate reads on the relay's side


def test_relay_floor_relays_bytes_unchanged_after_one_prefill_each(tmp_path: Path) -> None:
    p_port, r_port = free_port(), free_port()
    prefill = start_mock_engine(p_port, tmp_path / "p.log", *MOCK_HEADERS, "--role", "prefill")
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []
    decode = threading.Thread(target=_fake_decode, args=(server, seen), daemon=True)
    decode.start()
    relay = subprocess.Popen(
        [
            sys.executable, str(ROOT / "benchmarks" / "relay_floor.py"), "--port", str(r_port),
            "--prefill", f"http://127.0.0.1:{p_port}", "--decode", f"http://127.0.0.1:{server.getsockname()[1]}",
            "--prefill-body", json.dumps(bench_proxy.PREFILL_BODY),
        ],
        stdout=(tmp_path / "relay.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    requests = [
        _request({"model": "mock", "prompt": "a b c", "max_tokens": 3, "stream": True}),
        _request({"model": "mock", "prompt": "a b c", "max_tokens": 3}),
    ]
    try:
        _wait_listening(r_port, relay)
        assert _prefill_requests(p_port) == 0
        with socket.create_connection(("127.0.0.1", r_port), timeout=10) as s:  # both on one connection
            relayed = [_exchange(s, r) for r in requests]
        decode.join(10)
        prefills = _prefill_requests(p_port)
    finally:
        server.close()
        for proc in (relay, prefill):
            proc.terminate()
            proc.wait(timeout=30)
    assert seen == requests  # decode got the client's requests as sent
    assert relayed == [b"".join(STREAMED_ANSWER), b"".join(WHOLE_ANSWER)]  # and the client decode's answers
    assert prefills == 2  # one prefill leg per relayed request


def test_streamed_client_counts_each_token_and_fails_what_did_not_come(tmp_path: Path) -> None:
    port = free_port()
    engine = start_mock_engine(port, tmp_path / "d.log", *MOCK_HEADERS, "--itl-ms", "1")
    try:
        ok = bench_proxy.Run("direct", 2, 1, 0.0)
        asyncio.run(bench_proxy.run_streams(f"http://127.0.0.1:{port}/v1/completions", 2, 4, ok))
    finally:
        engine.terminate()
        engine.wait(timeout=30)
    assert ok.errors == 0 and ok.sent == 4 and len(ok.latencies) == len(ok.ttfts) == 4
    assert ok.tokens == 4 * bench_proxy.STREAM_OSL
    assert 4 <= ok.reads <= ok.tokens + 4  # at most a read per token (and the head's), at least one a request
    failed = bench_proxy.Run("direct", 2, 1, 0.0)  # the engine is gone: every request fails, none is lost
    asyncio.run(bench_proxy.run_streams(f"http://127.0.0.1:{port}/v1/completions", 2, 4, failed))
    assert failed.errors == 4 and failed.sent == failed.tokens == 0


def test_streamed_verdict_needs_cheaper_tokens_no_failures_and_no_more_batching() -> None:
    verdict = bench_proxy.streamed_verdict
    assert verdict(10.0, 11.0, 0, 1.0, 1.0)
    assert verdict(11.0, 11.0, 0, 1.0, 1.0)  # equal passes: the goal is "at most the peer's"
    assert not verdict(11.5, 11.0, 0, 1.0, 1.0)
    assert not verdict(10.0, 11.0, 1, 1.0, 1.0)  # one failed request anywhere fails the point
    # Cheaper only because pdbench got its tokens more batched than the peer did: not a pass.
    assert not verdict(6.0, 11.0, 0, 2.0, 1.0)
    assert verdict(10.0, 11.0, 0, 1.1, 1.0) and not verdict(10.0, 11.0, 0, 1.11, 1.0)


def test_overhead_is_each_rounds_mean_minus_direct_with_router_only_cpu() -> None:
    osl = bench_proxy.STREAM_OSL

    def run(target: str, rnd: int, lat: float, ttft: float, cpu_s: float = 0.0) -> bench_proxy.Run:
        r = bench_proxy.Run(target, 8, rnd, 0.0, cpu_s=cpu_s, sent=2, tokens=2 * osl)
        r.latencies, r.ttfts = [lat, lat + 0.002], [ttft, ttft]
        return r

    # Direct drifts from round to round; the router adds 3 ms, 4 ms, 5 ms over its own round's direct.
    runs = [run("direct", k, 0.100 * k, 0.010) for k in (1, 2, 3)]
    runs += [run("pdbench", k, 0.100 * k + 0.002 + k * 0.001, 0.011, cpu_s=0.001 * k) for k in (1, 2, 3)]
    args = type("A", (), {"stream_concurrency": [8], "rounds": 3})()
    (row,) = bench_proxy.overhead_rows(runs, args)  # type: ignore[arg-type]  # only the fields it reads
    assert row["target"] == "pdbench" and row["rounds"] == 3  # vllm-router has no runs: no row
    added = row["added_latency_ms"]
    assert added["rounds"] == pytest.approx([3.0, 4.0, 5.0]) and added["mean"] == pytest.approx(4.0)
    assert added["half_width"] == pytest.approx(4.303 * 1.0 / 3**0.5, rel=1e-3)  # t(0.975, 2) * s / sqrt(n)
    assert row["added_ttft_ms"]["mean"] == pytest.approx(1.0)
    # Per streamed token after the first: the added time after the first token, over OSL - 1 tokens.
    assert row["added_per_token_us"]["rounds"] == pytest.approx([(a - 1.0) * 1e3 / (osl - 1) for a in (3, 4, 5)])
    assert row["cpu_us_per_request"]["rounds"] == pytest.approx([500.0, 1000.0, 1500.0])  # its own CPU alone
