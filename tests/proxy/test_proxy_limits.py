"""What the proxy accepts is bounded, and its own shortages are its own: over real sockets, an
oversized URL gets 414 and oversized or too many headers 431 (answered while the client still
sends, never buffered whole); the proxy and the bench client raise their open-file limit to the
hard one at start; and a proxy out of descriptors answers 503 naming itself, never taking a
healthy backend out of service."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.bench_fake_server import FakeServer
from helpers.harness_procs import wait_ok
from helpers.proxy_fakes import http_server, post, read_response

from benchmarks.common import free_ports, start_mock_engine
from harness import tiny_model

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
HUGE = 100 << 20  # the 100 MB header a hostile client sent
# harness.proxy.http's limits: a URL, a request's head, its header count.
MAX_URL, MAX_HEAD, MAX_HEADERS = 8 * 1024, 64 * 1024, 100


def _get(path: str, headers: list[tuple[str, str]]) -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode()


async def _status(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        status, _, _ = await read_response(reader)
        return status
    finally:
        writer.close()


def test_oversized_urls_and_headers_are_refused_at_sane_limits() -> None:
    async def go() -> None:
        async with http_server() as (port, _):
            # Just inside every limit: served (the echo route answers 200, an unknown path 404).
            many = [
                (f"X-H{i}", "v" * ((MAX_HEAD - MAX_URL) // MAX_HEADERS - 16)) for i in range(MAX_HEADERS - 2)
            ]  # with Host and Content-Length: 100
            assert (await _status(port, post("/echo", b"{}", "".join(f"{k}: {v}\r\n" for k, v in many))))[
                9:12
            ] == b"200"
            assert (await _status(port, _get("/" + "a" * (MAX_URL - 1), [])))[9:12] == b"404"
            # Just past them: refused, the connection closed after the answer.
            assert (await _status(port, _get("/" + "a" * MAX_URL, [])))[9:12] == b"414"
            assert (await _status(port, _get("/echo", [(f"X-H{i}", "v") for i in range(MAX_HEADERS + 1)])))[
                9:12
            ] == b"431"
            assert (await _status(port, _get("/echo", [("X-Big", "v" * MAX_HEAD)])))[9:12] == b"431"

    asyncio.run(go())


def test_a_huge_header_is_answered_431_while_it_is_still_being_sent() -> None:
    async def go() -> None:
        async with http_server() as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nX-Big: ")
            sent = 0

            async def send() -> None:
                nonlocal sent
                piece = b"a" * 65536
                try:
                    while sent < HUGE:
                        writer.write(piece)
                        await writer.drain()
                        sent += len(piece)
                except (ConnectionError, OSError):
                    pass

            sender = asyncio.ensure_future(send())
            try:
                status, _, body = await asyncio.wait_for(read_response(reader), 10)
            finally:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
                writer.close()
            assert status.startswith(b"HTTP/1.1 431"), status
            assert f"request head over {MAX_HEAD} bytes".encode() in body
            assert sent < HUGE // 4, sent  # refused on the way, not after buffering it all

    asyncio.run(go())


def _nofile(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-file limit in /proc/{pid}/limits")


def _low_soft_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] <= 256, reason="the hard open-file limit is 256")
def test_the_proxy_and_the_client_raise_their_open_file_limit(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    (port,) = free_ports(1)
    args = [sys.executable, "-m", "harness", "proxy", "--port", str(port), "--decode", "http://127.0.0.1:9"]
    args += ["--prefill", "http://127.0.0.1:9"]
    with (tmp_path / "proxy.log").open("wb") as log:
        proxy = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_low_soft_limit)
    try:
        deadline = time.monotonic() + 30
        while "open-file limit" not in (tmp_path / "proxy.log").read_text() and time.monotonic() < deadline:
            assert proxy.poll() is None, (tmp_path / "proxy.log").read_text()
            time.sleep(0.05)
        assert _nofile(proxy.pid) == (hard, hard), (tmp_path / "proxy.log").read_text()
    finally:
        _stop(proxy)

    model = tiny_model.build(tmp_path / "m")
    seen: list[tuple[int, int]] = []
    pid: list[int] = []

    def policy(n: int, body: dict) -> None:  # the bench's limit, read while it sends its first request
        if not seen:
            seen.append(_nofile(pid[0]))

    with FakeServer(policy) as srv:
        argv = ["bench", "--base-url", srv.base_url, "--model", "tiny", "--tokenizer", str(model), "--isl", "8"]
        argv += ["--osl", "2", "--concurrency", "1", "--num-prompts", "2", "--num-warmups", "0", "--workers", "1"]
        argv += ["--results-dir", str(tmp_path / "r"), "--progress", "plain"]
        cmd = [sys.executable, "-m", "harness", *argv]
        bench = subprocess.Popen(cmd, cwd=REPO, preexec_fn=_low_soft_limit, stdout=subprocess.DEVNULL)
        pid.append(bench.pid)
        try:
            assert bench.wait(90) == 0
        finally:
            _stop(bench)
    assert seen == [(hard, hard)]


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_proxy_out_of_descriptors_answers_503_and_ejects_no_backend(tmp_path: Path) -> None:
    p_port, d_port, proxy_port = free_ports(3)
    engines = [
        start_mock_engine(p_port, tmp_path / "p.log", "--model", "tiny", "--role", "prefill"),
        start_mock_engine(d_port, tmp_path / "d.log", "--model", "tiny", "--role", "decode"),
    ]
    limit = 64

    def pinned() -> None:  # soft = hard: the proxy cannot raise it
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    args = [sys.executable, "-m", "harness", "proxy", "--port", str(proxy_port)]
    args += ["--prefill", f"http://127.0.0.1:{p_port}", "--decode", f"http://127.0.0.1:{d_port}"]
    args += ["--breaker-failures", "1", "--breaker-min-open-s", "60", "--health-interval-s", "60"]
    with (tmp_path / "proxy.log").open("wb") as log:
        proxy = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pinned)
    held: list[socket.socket] = []
    try:
        wait_ok(f"http://127.0.0.1:{proxy_port}/health", [proxy], timeout=30.0)
        time.sleep(0.5)  # the first health polls' connections settle
        # Fill the proxy's descriptors with idle client connections, each accepted (one fd each).
        while _fds(proxy.pid) < limit:
            before = _fds(proxy.pid)
            held.append(socket.create_connection(("127.0.0.1", proxy_port), timeout=5))
            deadline = time.monotonic() + 5
            while _fds(proxy.pid) <= before and time.monotonic() < deadline:
                time.sleep(0.01)
        # Precondition: the proxy holds every descriptor it may have.
        assert _fds(proxy.pid) == limit
        s = held[0]
        body = b'{"model":"tiny","prompt":"hi","max_tokens":2}'
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        s.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        answer = _read_answer(s)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"proxy_resources" in answer and b"Too many open files" in answer, answer
        # Descriptors back: the next request is served by the same backends, none taken out.
        for c in held[1:6]:
            c.close()
        time.sleep(0.2)
        req = urllib.request.Request(
            f"http://127.0.0.1:{proxy_port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        log_text = (tmp_path / "proxy.log").read_text()
        assert "taken out" not in log_text, log_text
    finally:
        for c in held:
            c.close()
        _stop(proxy)
        for e in engines:
            _stop(e)


def _read_answer(s: socket.socket) -> bytes:
    s.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest
