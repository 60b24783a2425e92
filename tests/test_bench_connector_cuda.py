"""The CPU parts of benchmarks/bench_connector_cuda.py: the raw-TCP ceiling it takes from
bench_connector_transfer no longer spins on a request beyond its buffers (a 65,536-token pull
is 3.76 GB), and its goals decide the exit code."""

from __future__ import annotations

import time

import pytest

from benchmarks import bench_connector_cuda as bench
from benchmarks.bench_connector_transfer import Sender
from benchmarks.common import free_port


def test_a_raw_request_beyond_the_ceilings_buffers_fails_at_once() -> None:
    """The 65,536-token hang: the ceiling's receiver asked for more bytes than its (then 1 GiB)
    buffer held, recv_into of the empty rest returned 0, and the loop spun forever. The
    buffers are now sized to the largest request, and a request beyond them fails at once."""
    snd = Sender(free_port(), 1 << 20, bufs=(0,))
    try:
        conn = snd.conns[0]
        assert conn.raw(1 << 20) > 0  # what the buffers hold arrives
        t0 = time.monotonic()
        with pytest.raises(ConnectionError):
            conn.raw(3 << 20)
        assert time.monotonic() - t0 < 10
    finally:
        snd.close()


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
