"""The CPU parts of benchmarks/bench_connector_cuda.py: its raw-TCP ceiling runs at any size
(a 65,536-token pull is 3.76 GB, beyond any fixed buffer) and fails a stall within its bound,
and its goals decide the exit code."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from benchmarks import bench_connector_cuda as bench
from benchmarks.common import free_port


def test_ceiling_streams_sizes_beyond_its_window() -> None:
    """A size several windows long, not a multiple of one: it arrives whole, at every setting."""
    window, size = 1 << 20, (3 << 20) + 12345
    t0 = time.monotonic()
    out = bench.tcp_ceiling(free_port(), [size, 4096], reps=1, bufs=(0, 1 << 20), window=window, stall_s=10)
    assert time.monotonic() - t0 < 90
    assert set(out) == {size, 4096}
    for seconds, buf in out.values():
        assert 0 < seconds < 10 and buf in (0, 1 << 20)


def test_a_stalled_raw_transfer_fails_with_its_position() -> None:
    a, b = socket.socketpair()
    with a, b:
        sent = threading.Event()

        def half() -> None:
            b.sendall(bytes(3000))  # then nothing more, connection kept open
            sent.set()

        threading.Thread(target=half, daemon=True).start()
        assert sent.wait(10)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"no byte for 0.3 s after 3000 of 10000 bytes"):
            bench.recv_stream(a, 10000, memoryview(bytearray(1024)), 0.3)
        assert 0.25 < time.monotonic() - t0 < 5


def test_a_closed_raw_transfer_fails_at_once() -> None:
    a, b = socket.socketpair()
    with a:
        b.sendall(bytes(100))
        b.close()
        with pytest.raises(RuntimeError, match="sender closed after 100 of 5000 bytes"):
            bench.recv_stream(a, 5000, memoryview(bytearray(64)), 10)


def test_goals_pass_only_when_every_row_meets_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    good = {"target": "tcp", "tokens": 1024, "pass": True, "goal": "pull / min(limits) 0.91 >= 0.7"}
    bad = {"target": "ipc", "tokens": 65536, "pass": False, "goal": "pull - block copy 2.40 ms <= 2 ms"}
    assert bench.judge([good])
    assert "PASS      tcp   1024 tokens" in capsys.readouterr().out
    assert not bench.judge([good, bad])
    out = capsys.readouterr().out
    assert "FAIL      ipc  65536 tokens: pull - block copy 2.40 ms <= 2 ms" in out
    assert "RESULT: FAIL (1 of 2 rows met their goal)" in out
    crashed = bench.failed_target("tcp", RuntimeError("pull of 65536 tokens did not finish in 135 s"))
    assert not bench.judge([good, crashed])
    assert "FAIL      tcp: did not run to the end: RuntimeError: pull of 65536" in capsys.readouterr().out
    assert not bench.judge([])  # nothing measured is no pass


def test_pull_bound_grows_with_size() -> None:
    assert bench.pull_bound_s(1 << 20) < 61
    assert 120 < bench.pull_bound_s(3_758_096_384) < 150
