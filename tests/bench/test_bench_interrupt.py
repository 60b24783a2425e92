"""Ctrl-C in `pdbench bench`, typed on a terminal: `python -m harness bench` runs in a pty whose
line discipline turns ^C into SIGINT for the bench's whole process group (its load processes
too), as a person's terminal does.

The first Ctrl-C stops sending, says so, waits (bounded) for the requests in flight, writes the
point so far marked interrupted (its sentinels finished and recorded), skips the points left and
exits 130; a second one cancels the requests in flight at once.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.bench_fake_server import FakeServer
from helpers.terminal import Terminal
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import free_port, start_mock_engine
from harness import tiny_model
from harness.bench.sentinels import CANCELLED
from harness.bench.stops import SAME_CTRL_C_S
from harness.bench.sweep import INTERRUPTED

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


def _args(model_dir: str, result_dir: Path, url: str, *flags: str) -> list[str]:
    """The fixed settings in a --config file (its keys are the settings' names), the rest as flags."""
    config = result_dir.parent / f"{result_dir.name}-bench.json"
    settings = {
        "base_url": url,
        "model": "tiny",
        "tokenizer": model_dir,
        "isl": 16,
        "osl": 20,
        "num_warmups": 0,
        "result_dir": str(result_dir),
        "prefill_gpus": 1,
        "decode_gpus": 1,
    }
    config.write_text(json.dumps(settings))
    return ["--config", str(config), *flags]


def _measured(srv: FakeServer) -> list[int]:
    """Arrival numbers of the measured requests (sentinels ask for token ids)."""
    return [n for n, b in enumerate(list(srv.bodies)) if not b.get("return_token_ids")]


def test_first_ctrl_c_drains_writes_the_point_and_skips_the_rest(model_dir: str, tmp_path: Path) -> None:
    n = 40
    with FakeServer(token_delay=0.002) as ref, FakeServer(token_delay=0.03) as target:
        term = Terminal(
            _args(
                model_dir,
                tmp_path / "r",
                target.base_url,
                "--concurrency",
                "2,4",
                "--num-prompts",
                str(n),
                "--workers",
                "1",
                "--scrape",
                f"prefill-0=prefill@{ref.base_url}",
            )
        )
        try:
            # Precondition: the first point is under way, on a terminal (the rich bar), with a
            # sentinel already answered and most of its requests still to send.
            term.wait_for(
                "12 measured requests answered", lambda: sum(i in target.ended for i in _measured(target)) >= 12
            )
            assert "C=2" in term.output and "━" in term.output, term.output
            assert any(b.get("return_token_ids") for b in list(target.bodies))  # the first sentinel
            term.ctrl_c()
            term.wait_for("the stop message", lambda: "Ctrl-C: sending stopped" in term.output)
            rc = term.exit_code(30)
        finally:
            term.close()
        measured = _measured(target)
        unfinished = [i for i in measured if i not in target.ended]
    out = term.output
    assert rc == 130, out
    # Requests were in flight at the Ctrl-C (C=2, each takes 0.6 s), and were waited for.
    waited = re.search(r"waiting up to 30 s for (\d+) request\(s\) in flight", out)
    assert waited and int(waited[1]) >= 1 and "Ctrl-C again to stop now" in out, out
    # The display said the point was stopping, and then ended as interrupted.
    assert "C=2 stopping (Ctrl-C)" in out and "in flight" in out
    assert "interrupted (Ctrl-C)" in out and "C=4: not run" in out and "--resume" in out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out

    (path,) = (tmp_path / "r").glob("*.json")
    result = json.loads(path.read_text())
    assert result["max_concurrency"] == 2 and result["stop_reason"] == INTERRUPTED
    # Every request that left was waited for: the server finished each, the result counts each
    # as completed, and no request of C=4 was ever sent.
    assert not unfinished
    # The requests the Ctrl-C kept from being sent are neither completed nor failed.
    assert 12 <= result["completed"] == len(measured) < n
    assert (result["failed"], result["not_sent"]) == (0, n - len(measured)) and result["errors"] == []
    counts = f"{result['completed']} completed, 0 failed, {result['not_sent']} never sent"
    assert f"{counts}, written as interrupted -> {path}" in out
    # The requests the Ctrl-C kept from being sent, and the sentinels it cancelled, are not the
    # servers' failures.
    rules = {r["name"]: r for r in result["metadata"]["validity"]["rules"]}
    assert rules["failed_requests"]["status"] == "passed", rules["failed_requests"]
    # Its sentinels finished and are recorded beside it.
    s = result["sentinels"]
    assert 1 <= s["sent"] <= 4 and s["record"] == "sentinels/concurrency_2.json"
    record = json.loads((tmp_path / "r" / s["record"]).read_text())
    assert record["check"]["sent"] == s["sent"] and len(record["sentinels"]) == 4


def test_one_ctrl_c_under_timeout_is_one_ctrl_c(model_dir: str, tmp_path: Path) -> None:
    # coreutils' timeout passes the SIGINT its process group got from the terminal on to the
    # bench, then to the group again: one keypress arrives three times.
    with FakeServer(token_delay=0.03) as target:
        term = Terminal(
            _args(model_dir, tmp_path / "r", target.base_url, "--concurrency", "2", "--num-prompts", "40"),
            wrapper=("timeout", "300"),
        )
        try:
            term.wait_for(
                "4 measured requests answered", lambda: sum(i in target.ended for i in _measured(target)) >= 4
            )
            term.ctrl_c()
            rc = term.exit_code(60)
        finally:
            term.close()
        measured = _measured(target)
        unfinished = [i for i in measured if i not in target.ended]
    out = term.output
    assert rc == 130, out  # timeout exits with the bench's status
    waited = re.search(r"waiting up to 30 s for (\d+) request\(s\) in flight", out)
    assert waited and int(waited[1]) >= 1, out  # requests were in flight at the Ctrl-C ...
    assert "second Ctrl-C" not in out and "Traceback" not in out, out
    (path,) = (tmp_path / "r").glob("*.json")
    result = json.loads(path.read_text())
    # ... and each was waited for, none cancelled.
    assert not unfinished and result["completed"] == len(measured), result["errors"]
    assert result["stop_reason"] == INTERRUPTED


def _hang_after(k: int) -> Callable[[int, dict], str | None]:
    """Measured requests after the k-th one hang (until the server stops)."""
    return lambda n, body: "hang" if n >= k and not body.get("return_token_ids") else None


def test_second_ctrl_c_cancels_the_requests_in_flight_at_once(model_dir: str, tmp_path: Path) -> None:
    with FakeServer(policy=_hang_after(4), token_delay=0.002) as target:
        term = Terminal(
            _args(
                model_dir,
                tmp_path / "r",
                target.base_url,
                "--concurrency",
                "2",
                "--num-prompts",
                "10",
                "--interrupt-grace-s",
                "60",
            )
        )
        try:
            # Precondition: two requests are in flight and will not finish on their own.
            term.wait_for("two hanging requests", lambda: len(target.bodies) >= 6 and len(target.ended) == 4)
            term.ctrl_c()
            first = time.monotonic()
            term.wait_for("the stop message", lambda: "waiting up to 60 s for 2 request(s)" in term.output)
            # A person's second Ctrl-C, not the first one delivered again (see the test below).
            term.wait_for("a second keypress", lambda: time.monotonic() - first > SAME_CTRL_C_S)
            t0 = time.monotonic()
            term.ctrl_c()
            rc = term.exit_code(20)
            took = time.monotonic() - t0
        finally:
            term.close()
    out = term.output
    assert rc == 130, out
    assert "second Ctrl-C: cancelling 2 request(s) in flight now" in out
    assert took < 15, f"{took:.1f} s after the second Ctrl-C"  # not the 60 s grace
    (path,) = (tmp_path / "r").glob("*.json")
    result = json.loads(path.read_text())
    # The two in flight were cancelled (failed); the four left were never sent.
    assert result["stop_reason"] == INTERRUPTED
    assert (result["completed"], result["failed"], result["not_sent"]) == (4, 2, 4)
    assert len(result["errors"]) == 2 and all("second Ctrl-C" in e for e in result["errors"]), result["errors"]


def test_in_flight_requests_are_cancelled_after_the_grace(model_dir: str, tmp_path: Path) -> None:
    # Two load processes: the drain reaches each of them, and neither dies of the SIGINT the
    # terminal sends to the whole process group.
    with FakeServer(policy=_hang_after(4), token_delay=0.002) as target:
        term = Terminal(
            _args(
                model_dir,
                tmp_path / "r",
                target.base_url,
                "--concurrency",
                "2,4",
                "--num-prompts",
                "10",
                "--workers",
                "2",
                "--interrupt-grace-s",
                "1",
            )
        )
        try:
            term.wait_for("two hanging requests", lambda: len(target.bodies) >= 6 and len(target.ended) == 4)
            term.ctrl_c()
            rc = term.exit_code(30)
        finally:
            term.close()
    out = term.output
    assert rc == 130, out
    assert "load worker" not in out  # no worker died
    (path,) = (tmp_path / "r").glob("*.json")
    result = json.loads(path.read_text())
    assert result["stop_reason"] == INTERRUPTED
    assert (result["completed"], result["failed"], result["not_sent"]) == (4, 2, 4)
    late = [e for e in result["errors"] if "still in flight after the 1 s grace" in e]
    assert len(late) == 2 == len(result["errors"]), result["errors"]
    assert "C=4: not run" in out


def test_ctrl_c_before_the_first_point_ends_the_setup(model_dir: str, tmp_path: Path) -> None:
    # The reference never finishes its answers: the sweep is stuck before its first point.
    with FakeServer(policy=lambda n, body: "hang") as ref, FakeServer() as target:
        term = Terminal(
            _args(
                model_dir,
                tmp_path / "r",
                target.base_url,
                "--concurrency",
                "2,4",
                "--num-prompts",
                "10",
                "--scrape",
                f"prefill-0=prefill@{ref.base_url}",
            )
        )
        try:
            term.wait_for("the reference asked", lambda: len(ref.bodies) >= 2)
            term.ctrl_c()
            rc = term.exit_code(20)
        finally:
            term.close()
        assert not target.bodies  # no load was sent
    out = term.output
    assert rc == 130, out
    assert "Ctrl-C: stopping; the points left are skipped" in out
    assert "C=2: not run" in out and "C=4: not run" in out
    assert not (tmp_path / "r").exists()
    assert "Traceback" not in out and "CancelledError" not in out


def test_ctrl_c_after_the_batch_cancels_the_sentinels_still_out(model_dir: str, tmp_path: Path) -> None:
    # The target never finishes a sentinel: once the measured requests are done, the point
    # waits for its sentinels (each bounded by the 60 s request timeout).
    hang_sentinels = lambda n, body: "hang" if body.get("return_token_ids") else None  # noqa: E731
    with FakeServer(token_delay=0.002) as ref, FakeServer(policy=hang_sentinels, token_delay=0.002) as target:
        term = Terminal(
            _args(
                model_dir,
                tmp_path / "r",
                target.base_url,
                "--concurrency",
                "2,4",
                "--num-prompts",
                "20",
                "--request-timeout-s",
                "60",
                "--scrape",
                f"prefill-0=prefill@{ref.base_url}",
            )
        )
        try:
            # Precondition: every measured request of C=2 is done, its 4 sentinels are out.
            def waiting() -> bool:
                bodies = list(target.bodies)
                sentinels = [n for n, b in enumerate(bodies) if b.get("return_token_ids")]
                return len(bodies) == 24 and len(sentinels) == 4 and len(target.ended) == 20

            term.wait_for("the sentinels still out after the batch", waiting)
            assert not (tmp_path / "r" / "sentinels" / "concurrency_2.json").exists()
            t0 = time.monotonic()
            term.ctrl_c()
            rc = term.exit_code(20)
            took = time.monotonic() - t0
        finally:
            term.close()
    out = term.output
    assert rc == 130, out
    assert took < 15, f"{took:.1f} s after the Ctrl-C"  # not the 60 s request timeout
    (path,) = (tmp_path / "r").glob("*.json")
    result = json.loads(path.read_text())
    # The measured requests all finished: the point is whole; its sentinels were cancelled.
    assert result["completed"] == 20 and result["stop_reason"] is None
    assert result["sentinels"]["sent"] == 4 and result["sentinels"]["answered"] == 0
    record = json.loads((tmp_path / "r" / "sentinels" / "concurrency_2.json").read_text())
    assert {s["answer"]["error"] for s in record["sentinels"]} == {CANCELLED}
    rules = {r["name"]: r for r in result["metadata"]["validity"]["rules"]}
    assert rules["failed_requests"]["status"] == "passed", rules["failed_requests"]
    assert f"C=2: done -> {path}" in out and "C=4: not run" in out


def test_ctrl_c_during_warmups_writes_nothing(model_dir: str, tmp_path: Path) -> None:
    with FakeServer(token_delay=0.03) as target:
        term = Terminal(
            _args(
                model_dir,
                tmp_path / "r",
                target.base_url,
                "--concurrency",
                "2",
                "--num-prompts",
                "4",
                "--num-warmups",
                "20",
            )
        )
        try:
            # Precondition: the warmups are under way (2 of 20 answered), none measured yet.
            term.wait_for("two warmups answered", lambda: len(target.ended) >= 2)
            term.ctrl_c()
            term.wait_for("the stop message", lambda: "Ctrl-C: sending stopped" in term.output)
            rc = term.exit_code(30)
        finally:
            term.close()
        arrived = len(target.bodies)
    out = term.output
    assert rc == 130, out
    assert arrived < 20  # the warmups left were never sent, nor any measured request
    assert "C=2 warmup stopping (Ctrl-C)" in out
    assert "stopped during warmups: interrupted" in out and "C=2: not run" in out
    assert not (tmp_path / "r").exists()


def _engine_successes(url: str) -> int:
    """Requests the mock engine finished, from its vllm:request_success counter."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return int(
        sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "vllm:request_success_total"
        )
    )


def test_requests_a_ctrl_c_kept_from_being_sent_are_not_counted_failed(model_dir: str, tmp_path: Path) -> None:
    """A user's Ctrl-C mid-point against the mock engine: what the engine answered is completed,
    nothing failed, and what was never sent is counted apart, in the file and on the terminal."""
    n, port = 40, free_port()
    engine = start_mock_engine(port, tmp_path / "engine.log", "--model", "mock", "--itl-ms", "20")
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "bench.json"
    settings = {"base_url": url, "model": "mock", "tokenizer": model_dir, "isl": 16, "osl": 20, "num_warmups": 0}
    config.write_text(json.dumps(settings | {"result_dir": str(tmp_path / "r"), "gpus": 1}))
    try:
        term = Terminal(["--config", str(config), "--concurrency", "2", "--num-prompts", str(n)])
        try:
            # Precondition: the point is under way, most of its requests still to send.
            term.wait_for("4 requests answered", lambda: _engine_successes(url) >= 4)
            term.ctrl_c()
            rc = term.exit_code(30)
        finally:
            term.close()
        answered = _engine_successes(url)
    finally:
        engine.terminate()
        engine.wait(30)
    out = term.output
    assert rc == 130 and answered < n, out
    (path,) = (tmp_path / "r").glob("*.json")
    result = json.loads(path.read_text())
    assert result["stop_reason"] == INTERRUPTED
    # Every request the engine saw was waited for and completed; the rest were never sent.
    assert (result["completed"], result["failed"], result["not_sent"]) == (answered, 0, n - answered)
    assert result["errors"] == [] and sum(t is None for t in result["start_times"]) == n - answered
    assert f"completed {answered}, failed 0" in out and f"{n - answered} never sent" in out
    assert f"cut short, {answered} completed, 0 failed, {n - answered} never sent" in out
