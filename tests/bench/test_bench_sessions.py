"""Multi-turn sessions: how a session is drawn and grown turn by turn, and sweeps of them against a
fake streaming server (the bodies each turn sent) and the mock engine (its prompt token counts)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers.bench_fake_server import FakeServer
from helpers.harness_procs import wait_ok
from helpers.terminal import Terminal

from benchmarks.common import free_port, free_ports, start_mock_engine
from harness import tiny_model
from harness.bench import ClientConfig, run_sweep, run_sweep_detailed
from harness.bench.client import Slot, Target
from harness.bench.loadgen import Progress
from harness.bench.sessions import Conversation, SessionRun, plan_sessions, think_times
from harness.bench.sweep import INTERRUPTED
from harness.bench.tokenizer import load_tokenizer
from harness.config.benchmark import SessionSettings
from harness.rundir.schedule_summary import ScheduleSummary
from harness.rundir.session_summary import SessionSummary

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))


@pytest.fixture(scope="module")
def tok(model_dir, tmp_path_factory):
    return load_tokenizer(model_dir, cache_dir=tmp_path_factory.mktemp("cache"))


def _plan(tok, seed=0, count=3, **settings):
    s = SessionSettings(**({"turns": 3, "user_tokens": 12} | settings))
    return plan_sessions(tok, count, 40, 5, s, 1.0, "inferencex", np.random.default_rng(seed))


# -- drawing and growing a session ----------------------------------------------------


def test_a_session_is_drawn_with_exact_token_counts(tok):
    specs = _plan(tok)
    assert len(specs) == 3 and all(s.turns == 3 for s in specs)
    for spec in specs:
        # Turn 1: isl tokens as the server sees them (special tokens included), as the random dataset.
        assert spec.first.prompt_len == 40 == tok.count(spec.first.prompt)
        # Later turns: user_tokens of new text, which continues a prompt (no special tokens of its own).
        assert [len(tok.encode(t)) for t in spec.user_texts] == [12, 12]
        assert spec.output_lens == (5, 5, 5)
    assert len({s.first.prompt for s in specs}) == 3  # sessions do not share their prompts


def test_sessions_and_think_times_are_seeded(tok):
    assert _plan(tok, seed=7, think_time_s=2.0) == _plan(tok, seed=7, think_time_s=2.0)
    assert _plan(tok, seed=7) != _plan(tok, seed=8)
    settings = SessionSettings(think_time_s=2.0)
    draws = think_times(settings, 20_000, np.random.default_rng(1))
    assert abs(draws.mean() - 2.0) < 0.1 and draws.max() <= 20.0  # exponential, cut at 10x the mean
    assert (think_times(settings, 5, np.random.default_rng(1)) == draws[:5]).all()
    uniform = think_times(
        SessionSettings(think_time_s=2.0, think_time_distribution="uniform"), 20_000, np.random.default_rng(1)
    )
    assert uniform.min() >= 0 and uniform.max() <= 4.0 and abs(uniform.mean() - 2.0) < 0.1
    constant = think_times(
        SessionSettings(think_time_s=2.0, think_time_distribution="constant"), 3, np.random.default_rng(1)
    )
    assert constant.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_think_times_have_their_distributions_shape(seed):
    # Shape, not only the mean: a Kolmogorov-Smirnov test of a seeded sample of 4,000 against
    # the configured law (the 10x cut of the exponential removes e^-10 of its mass). The
    # threshold p > 0.001 is two-sided in effect: the right law passes with a wide margin, an
    # exponential made uniform, or its tail cut at 3x the mean, or a uniform narrowed to
    # [0.5, 1.5] x the mean, each gives p < 1e-6 (measured, seeds 1-3: p of the right laws
    # 0.18-0.91; of the exponential cut at 3x, 5e-9).
    from scipy import stats

    rng = np.random.default_rng(seed)
    expo = think_times(SessionSettings(think_time_s=2.0), 4000, rng)
    assert stats.kstest(expo, stats.expon(scale=2.0).cdf).pvalue > 1e-3
    assert stats.kstest(expo, stats.uniform(0, 4.0).cdf).pvalue < 1e-6  # the test tells them apart
    uniform = think_times(SessionSettings(think_time_s=2.0, think_time_distribution="uniform"), 4000, rng)
    assert stats.kstest(uniform, stats.uniform(0, 4.0).cdf).pvalue > 1e-3
    assert stats.kstest(uniform, stats.expon(scale=2.0).cdf).pvalue < 1e-6


def test_turn_k_prompt_holds_turn_k_minus_1_prompt_and_answer(tok):
    spec = _plan(tok)[0]
    conv = Conversation(spec, chat=False)
    p1 = conv.prompt(1)
    conv.answered(" the first answer")
    p2 = conv.prompt(2)
    conv.answered(" the second answer")
    p3 = conv.prompt(3)
    assert p1 == spec.first.prompt
    assert p2 == p1 + "\n the first answer" + spec.user_texts[0]
    assert p3 == p2 + "\n the second answer" + spec.user_texts[1]
    # Each sent prompt is a start of the conversation (what count_prompts counts).
    assert [conv.text[:c] for c in conv.cuts] == [p1, p2, p3]

    # An answer that begins with letters does not merge into the prompt's last word: the next
    # turn's tokens begin with exactly this turn's (what the server's prefix cache matches).
    glued_breaks = 0
    for one in _plan(tok, count=30):
        for answer in ("e", "ed", "n"):
            c = Conversation(one, chat=False)
            first = tok.encode(c.prompt(1))
            c.answered(answer)
            assert tok.encode(c.prompt(2))[: len(first)] == first
            glued_breaks += tok.encode(one.first.prompt + answer)[: len(first)] != first
    assert glued_breaks > 0  # without the line break some would merge: the check above can fail

    chat = Conversation(spec, chat=True)
    m1 = chat.prompt(1)
    chat.answered(" the first answer")
    m2 = chat.prompt(2)
    assert m1 == [{"role": "user", "content": spec.first.prompt}]
    assert m2 == [
        *m1,
        {"role": "assistant", "content": " the first answer"},
        {"role": "user", "content": spec.user_texts[0]},
    ]


# -- sweeps ---------------------------------------------------------------------------------


def _cfg(model_dir, result_dir, base_url, **kw):
    base = dict(
        base_url=base_url,
        model="tiny",
        tokenizer=model_dir,
        isl=32,
        osl=4,
        concurrency=[2],
        dataset="sessions",
        sessions={"turns": 3, "user_tokens": 8, "num_sessions": 3, "num_warmup_sessions": 1},
        result_dir=str(result_dir),
    )
    return ClientConfig(**(base | kw))


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_sessions_sweep_sends_each_turn_the_conversation_so_far(model_dir, tmp_path, endpoint):
    with FakeServer() as srv:
        (path,) = run_sweep(_cfg(model_dir, tmp_path, srv.base_url, endpoint=endpoint))
        bodies = list(srv.bodies)
    # 1 warmup session and 3 measured ones, of 3 turns each.
    assert len(bodies) == 4 * 3
    answer = "".join(f" t{i}" for i in range(4))  # what the fake server answers every turn
    if endpoint == "chat":
        convs = [b["messages"] for b in bodies]
        firsts = [c for c in convs if len(c) == 1]
        assert len(firsts) == 4
        for first in firsts:
            second = next(c for c in convs if len(c) == 3 and c[0] == first[0])
            third = next(c for c in convs if len(c) == 5 and c[0] == first[0])
            assert second[1] == {"role": "assistant", "content": answer} and second[2]["role"] == "user"
            assert third[:3] == second and third[3] == {"role": "assistant", "content": answer}
    else:
        prompts = [b["prompt"] for b in bodies]
        firsts = [p for p in prompts if not any(q != p and p.startswith(q) for q in prompts)]
        assert len(firsts) == 4
        for first in firsts:
            chain = sorted((p for p in prompts if p.startswith(first)), key=len)
            assert len(chain) == 3
            assert chain[1].startswith(first + "\n" + answer) and chain[2].startswith(chain[1] + "\n" + answer)

    result = json.loads(path.read_text())
    assert result["dataset_name"] == "sessions" and result["num_prompts"] == 9
    assert (result["completed"], result["failed"]) == (9, 0)
    s = SessionSummary.model_validate(result["sessions"])
    assert (s.turns, s.sessions_started, s.sessions_completed) == (3, 3, 3)
    assert [(t.turn, t.requests, t.completed) for t in s.by_turn] == [(1, 3, 3), (2, 3, 3), (3, 3, 3)]
    assert all(t.ttft_ms.p50 is not None and t.ttft_ms.p50 > 0 for t in s.by_turn)
    growth = [t.prompt_tokens_mean for t in s.by_turn]
    if endpoint == "completions":
        # The tokenizer's count of each turn's whole prompt: isl, then the answer and 8 new tokens each turn.
        assert growth[0] == 32 and growth[0] < growth[1] < growth[2]
    else:
        # Chat: the server's own count (the template adds tokens), which this fake server gives as 0.
        assert growth == [0, 0, 0]
    assert s.session_duration_s.p50 is not None and s.sentinels.startswith("none sent: no reference instance")


def test_a_failed_turn_ends_its_session(model_dir, tmp_path):
    # Bodies 0-2 are the warmup session; body 4 is the second turn of the first measured session.
    with FakeServer(policy=lambda n, body: "500" if n == 4 else None) as srv:
        (outcome,) = run_sweep_detailed(_cfg(model_dir, tmp_path, srv.base_url, concurrency=[1]))
        sent = len(srv.bodies)
    assert sent == 3 + 2 + 3 + 3  # the failed session's third turn was never sent
    result = json.loads(outcome.path.read_text())
    # The failed turn failed; the turn it kept from being sent is neither completed nor failed.
    assert (result["completed"], result["failed"], result["not_sent"]) == (7, 1, 1)
    assert len(result["errors"]) == 1 and result["errors"][0].startswith("HTTP 500")
    s = SessionSummary.model_validate(result["sessions"])
    assert (s.sessions_started, s.sessions_completed) == (3, 2)
    assert [(t.requests, t.completed) for t in s.by_turn] == [(3, 3), (3, 2), (2, 2)]


def test_think_time_paces_a_session(model_dir, tmp_path):
    settings = {"turns": 2, "num_sessions": 2, "num_warmup_sessions": 0, "think_time_s": 0.3}
    with FakeServer() as srv:
        (path,) = run_sweep(
            _cfg(
                model_dir,
                tmp_path,
                srv.base_url,
                concurrency=[2],
                sessions=settings | {"think_time_distribution": "constant"},
            )
        )
        arrived, ended = list(srv.arrived), dict(srv.ended)
    # Each session's second turn arrives a think time after its first turn's answer.
    assert len(arrived) == 4
    firsts, seconds = sorted(arrived)[:2], sorted(arrived)[2:]
    assert min(seconds) - max(ended[i] for i in range(2)) >= 0.29 - 0.05
    # ... and no later than that (each first turn ended by max(ended)): a think time
    # stretched by half, or paid twice, breaks this bound.
    assert max(seconds) - max(ended[i] for i in range(2)) <= 0.3 + 0.1
    s = SessionSummary.model_validate(json.loads(path.read_text())["sessions"])
    assert s.think_time.mean_s == 0.3 and s.session_duration_s.p50 >= 0.3
    assert firsts


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_sessions_against_the_mock_engine_count_prompts_as_it_does(model_dir, tmp_path, endpoint):
    # The mock engine counts each prompt with the same tokenizer (chat: through its chat template),
    # as vLLM does; its usage.prompt_tokens is that count.
    port = free_port()
    engine = start_mock_engine(
        port, tmp_path / "engine.log", "--model", "tiny", "--tokenizer", model_dir, "--itl-ms", "1"
    )
    try:
        settings = {"turns": 3, "num_sessions": 4, "num_warmup_sessions": 0}
        (path,) = run_sweep(
            _cfg(
                model_dir,
                tmp_path / "r",
                f"http://127.0.0.1:{port}",
                concurrency=[2],
                sessions=settings,
                endpoint=endpoint,
            )
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        engine.terminate()
        try:
            engine.wait(10)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait(10)
    result = json.loads(path.read_text())
    assert (result["completed"], result["failed"]) == (12, 0)
    s = SessionSummary.model_validate(result["sessions"])
    assert s.sessions_completed == 4
    growth = [t.prompt_tokens_mean for t in s.by_turn]
    assert growth[0] is not None and growth[0] < growth[1] < growth[2]
    if endpoint == "completions":
        assert growth[0] == 32  # exact: the client's own count
    else:
        assert growth[0] > 32  # the template's tokens, which only the server's count has
    # Every turn's prompt length in the result is what the engine counted (the sentinels are off):
    # completions by the client's tokenizer, chat from the server's usage.
    (served,) = [
        float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("vllm:prompt_tokens_total")
    ]
    assert sum(result["input_lens"]) == result["total_input_tokens"] == served


# -- trace replay through the sweep (harness.bench.trace draws and times it) ---------------------


def test_a_trace_replay_sends_the_traces_requests_at_its_times(model_dir, tmp_path, capsys):
    trace = Path(__file__).parents[1] / "fixtures" / "traces" / "sessions-small.jsonl"
    records = [json.loads(line) for line in trace.read_text().splitlines()][:8]
    with FakeServer() as srv:
        cfg = _cfg(
            model_dir,
            tmp_path,
            srv.base_url,
            dataset="mooncake_trace",
            dataset_path=str(trace),
            sessions=None,
            trace={"speed": 4.0, "max_requests": 8, "block_tokens": 16},
            num_warmups=1,
        )
        (path,) = run_sweep(cfg)
        bodies, arrived = list(srv.bodies), list(srv.arrived)
    assert len(bodies) == 1 + 8  # one warmup, then the trace's first 8 requests
    # At the trace's times: each request reaches the server at its timestamp / speed after the
    # first one did, never early (5 ms for the clock's wake-up), late only by the load and by
    # the 2-slot cap (a request finds both slots busy for at most one 8-token answer here).
    # Sending all at once, ignoring the speed or drifting 10 ms a request each break a bound.
    sched = [(r["timestamp"] - records[0]["timestamp"]) / 1000 / 4.0 for r in records]
    late = [(a - arrived[1]) - s for a, s in zip(arrived[1:], sched, strict=True)]
    assert all(-0.005 <= x <= 0.1 for x in late) and float(np.median(late)) <= 0.03, late
    result = json.loads(path.read_text())
    assert result["num_prompts"] == 8 and (result["completed"], result["failed"]) == (8, 0)
    assert result["input_lens"] == [r["input_length"] for r in records]
    assert [b["max_tokens"] for b in bodies[1:]] == [r["output_length"] for r in records]
    schedule = ScheduleSummary.model_validate(result["schedule"])
    assert (schedule.requests, schedule.sent, schedule.cap, schedule.speed) == (8, 8, 2, 4.0)
    assert schedule.span_s == pytest.approx((records[-1]["timestamp"] - records[0]["timestamp"]) / 1000 / 4)
    assert f"1 warmups, then the trace's 8 requests over {schedule.span_s:.1f} s (speed 4)" in capsys.readouterr().err


# -- stops: a point's time bound, a drain (the first Ctrl-C) and a stop (a dead target) ------------


def test_a_point_timeout_keeps_the_turns_that_finished(model_dir, tmp_path):
    # The warmup session is bodies 0-2; the first measured session's second turn (body 4) hangs.
    with FakeServer(policy=lambda n, body: "hang" if n == 4 else None) as srv:
        (outcome,) = run_sweep_detailed(_cfg(model_dir, tmp_path, srv.base_url, concurrency=[1], point_timeout_s=3))
    result = json.loads(outcome.path.read_text())
    assert result["stop_reason"].startswith("point timeout")
    assert (result["completed"], result["failed"], result["not_sent"]) == (1, 1, 7)  # the hung turn failed
    s = SessionSummary.model_validate(result["sessions"])
    assert (s.sessions_started, s.sessions_completed) == (1, 0)
    assert [(t.requests, t.completed) for t in s.by_turn] == [(1, 1), (1, 0), (0, 0)]


async def _session_run(tok, url: str, drain_after: float | None, stop_after: float | None):
    specs = _plan(tok, count=2, think_time_s=0.5, think_time_distribution="constant")
    target = Target.from_url(url + "/v1/completions")
    slots = [Slot(target, False, keep_text=True) for _ in range(2)]
    run = SessionRun(target, "completions", "tiny", True, specs, 2, 10.0, Progress(), slots, "k")
    loop = asyncio.get_running_loop()
    if drain_after is not None:
        loop.call_later(drain_after, run.drain, "drained", 5.0)
    if stop_after is not None:
        loop.call_later(stop_after, run.stop, "stopped")
    try:
        return run, await run.run(30.0)
    finally:
        for s in slots:
            s.close()


def test_a_drain_ends_sessions_in_their_think_time_and_sends_no_more(tok):
    with FakeServer() as srv:
        # Each session's first turn takes ~10 ms, then it thinks 0.5 s: the drain comes in that pause.
        run, reason = asyncio.run(_session_run(tok, srv.base_url, drain_after=0.25, stop_after=None))
        sent = len(srv.bodies)
    assert reason == "drained" and sent == 2
    assert [o.success for o in run.outs] == [True, False, False, True, False, False]
    assert {o.error for o in run.outs if not o.success} == {"drained"}


def test_a_stop_fails_the_turns_in_flight_at_once(tok):
    with FakeServer(policy=lambda n, body: "hang" if n >= 2 else None) as srv:
        t0 = time.perf_counter()
        run, reason = asyncio.run(_session_run(tok, srv.base_url, drain_after=None, stop_after=1.0))
        took = time.perf_counter() - t0
    assert reason == "stopped" and took < 5
    # Turn 1 of both answered; turn 2 of both hung and was cut by the stop; turn 3 never sent.
    assert [o.success for o in run.outs] == [True, False, False, True, False, False]
    assert [o.start_time is not None for o in run.outs] == [True, True, False, True, True, False]
    assert {o.error for o in run.outs if not o.success} == {"stopped"}


def test_ctrl_c_in_a_think_time_ends_the_point_at_once(model_dir, tmp_path):
    # `pdbench bench` on a terminal, as test_bench_interrupt runs it: ^C is SIGINT to its group.
    config = tmp_path / "bench.json"
    settings = {"turns": 3, "num_sessions": 4, "num_warmup_sessions": 0, "think_time_s": 20.0}
    with FakeServer() as srv:
        config.write_text(
            json.dumps(
                {
                    "base_url": srv.base_url,
                    "model": "tiny",
                    "tokenizer": model_dir,
                    "isl": 16,
                    "osl": 4,
                    "dataset": "sessions",
                    "sessions": settings | {"think_time_distribution": "constant"},
                    "result_dir": str(tmp_path / "r"),
                }
            )
        )
        term = Terminal(["--config", str(config), "--concurrency", "2,4"])
        try:
            # Precondition: both sessions in flight answered their first turn and think for 20 s.
            # (A ^C that comes while an answer's last bytes are still on their way lets it finish.)
            term.wait_for("two first turns answered", lambda: len(srv.ended) == 2)
            assert len(srv.bodies) == 2
            t0 = time.monotonic()
            term.ctrl_c()
            rc = term.exit_code(15)
            took = time.monotonic() - t0
        finally:
            term.close()
        sent = len(srv.bodies)
    out = term.output
    assert rc == 130 and took < 10, out  # not the 20 s think time, nor the 30 s grace
    assert sent == 2 and "C=4: not run" in out and "Traceback" not in out
    (path,) = (tmp_path / "r").glob("*.json")
    result = json.loads(path.read_text())
    assert result["stop_reason"] == INTERRUPTED
    assert (result["completed"], result["failed"], result["not_sent"]) == (2, 0, 10)
    s = SessionSummary.model_validate(result["sessions"])
    assert (s.sessions_started, s.sessions_completed) == (2, 0)
    assert [(t.requests, t.completed) for t in s.by_turn] == [(2, 2), (0, 0), (0, 0)]


def test_a_session_stays_on_one_decode_behind_the_session_policy(model_dir, tmp_path):
    # 1 prefill and 2 decode mock engines behind `pdbench proxy --policy session --timings-dir`:
    # each session's turns carry one X-Session-Id, so all of them land on one decode; every turn
    # carries its timing id too, so the TTFT breakdown finds each one.
    p_port, d1, d2, proxy_port = free_ports(4)
    engines = [("--port", str(p_port), "--role", "prefill")] + [
        ("--port", str(d), "--role", "decode") for d in (d1, d2)
    ]
    procs: list[subprocess.Popen[bytes]] = []
    turns, sessions = 4, 3  # 12 requests: round robin would give each decode 6, no multiple of 4
    try:
        for i, e in enumerate(engines):
            procs.append(
                start_mock_engine(int(e[1]), tmp_path / f"e{i}.log", "--model", "tiny", *e[2:], "--itl-ms", "1")
            )
        upstream = ["--prefill", f"http://127.0.0.1:{p_port}", "--decode", f"http://127.0.0.1:{d1}"]
        upstream += ["--decode", f"http://127.0.0.1:{d2}", "--policy", "session"]
        proxy_args = ["proxy", "--port", str(proxy_port), *upstream, "--timings-dir", str(tmp_path / "timings")]
        with (tmp_path / "proxy.log").open("wb") as log:
            proxy = subprocess.Popen(
                [sys.executable, "-m", "harness", *proxy_args], stdout=log, stderr=subprocess.STDOUT
            )
        procs.append(proxy)
        wait_ok(f"http://127.0.0.1:{proxy_port}/health", [proxy], timeout=30.0)
        settings = {"turns": turns, "num_sessions": sessions, "num_warmup_sessions": 0}
        cfg = _cfg(
            model_dir, tmp_path, f"http://127.0.0.1:{proxy_port}", sessions=settings, proxy_timings_dir="timings"
        )
        (path,) = run_sweep(cfg)
        served = [_finished(d) for d in (d1, d2)]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    result = json.loads(path.read_text())
    assert (result["completed"], result["failed"]) == (12, 0)
    assert sum(served) == 12 and all(n % turns == 0 for n in served), served
    b = result["ttft_breakdown"]
    assert b["requests"] == b["of"] == 12, b


def _finished(port: int) -> int:
    """The requests a mock engine finished (vllm:request_success_total, every finished_reason)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return int(sum(float(line.split()[-1]) for line in lines if line.startswith("vllm:request_success_total")))
