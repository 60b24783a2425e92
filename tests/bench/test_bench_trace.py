"""Trace replay: parsing a Mooncake trace, prompts whose shared blocks are shared tokens, the
schedule's offsets, and the lateness a replay reports (a fake clock, then a real local server)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.bench_fake_server import FakeServer

from harness import aio, tiny_model
from harness.bench.client import RequestOutput, Target, build_payload
from harness.bench.loadgen import LoadRun, Progress, SendClock
from harness.bench.tokenizer import PromptTokenizer, load_tokenizer
from harness.bench.trace import TraceError, TraceRecord, load_trace, offsets, schedule_section, synthesize
from harness.bench.trace_gen import TraceGenSettings, generate, write_trace
from harness.bench.workers import WorkerPool

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/traces/sessions-small.jsonl"
# The settings the fixture was generated with (test_the_fixture_is_the_generators_output).
FIXTURE_SETTINGS = TraceGenSettings(
    sessions=6, turns=3, rate=4, think_s=0.5, shared_blocks=1, first_blocks=1, new_blocks=1, output_length=8,
    block_tokens=16, seed=0,
)  # fmt: skip


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> PromptTokenizer:
    """The tiny model's byte-level BPE, read as a run reads it (from the cache)."""
    model = str(tiny_model.build(tmp_path_factory.mktemp("tok") / "m"))
    cache = tmp_path_factory.mktemp("cache")
    load_tokenizer(model, cache)
    return load_tokenizer(model, cache)


@pytest.fixture(scope="module")
def copy_tok(tmp_path_factory) -> PromptTokenizer:
    """The copy model's tokenizer: one token per character, no whole-word tokens."""
    return load_tokenizer(str(ROOT / "models/pdbench-copy"), tmp_path_factory.mktemp("cache"))


# -- parsing -----------------------------------------------------------------------------------


def _write(tmp_path: Path, *lines: object) -> Path:
    f = tmp_path / "t.jsonl"
    f.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return f


GOOD = {"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [0, 1]}


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "not JSON"),
        ([1, 2], "a trace line is a JSON object"),
        ({k: v for k, v in GOOD.items() if k != "hash_ids"}, "field 'hash_ids' is missing"),
        ({**GOOD, "timestamp": "5"}, "field 'timestamp' must be a number of ms >= 0, got '5'"),
        ({**GOOD, "timestamp": -1}, "field 'timestamp' must be a number of ms >= 0"),
        ({**GOOD, "input_length": 0}, "field 'input_length' must be a positive integer, got 0"),
        ({**GOOD, "output_length": 2.5}, "field 'output_length' must be a positive integer, got 2.5"),
        ({**GOOD, "output_length": True}, "field 'output_length' must be a positive integer, got True"),
        ({**GOOD, "hash_ids": [1, "a"]}, "field 'hash_ids' must be a list of integers >= 0"),
        ({**GOOD, "hash_ids": []}, "field 'hash_ids' is empty"),
    ],
)
def test_a_bad_line_is_named_by_file_line_and_field(tmp_path, line, says):
    f = _write(tmp_path, GOOD, "", line)
    with pytest.raises(TraceError) as e:
        load_trace(f)
    assert str(e.value).startswith(f"{f}:3: ") and says in str(e.value), e.value


def test_a_trace_goes_forward_in_time_and_is_not_empty(tmp_path):
    f = _write(tmp_path, {**GOOD, "timestamp": 10}, {**GOOD, "timestamp": 5})
    with pytest.raises(TraceError, match=r"t\.jsonl:2: field 'timestamp' 5 is before the previous request's 10"):
        load_trace(f)
    with pytest.raises(TraceError, match="no requests in the trace"):
        load_trace(_write(tmp_path, ""))
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "absent.jsonl")


def test_records_keep_their_fields_and_origin(tmp_path):
    f = _write(tmp_path, GOOD, {**GOOD, "timestamp": 12.5, "hash_ids": [0, 7], "extra": 1})
    a, b = load_trace(f)
    assert a == TraceRecord(0.0, 20, 4, (0, 1), f"{f}:1")
    assert (b.timestamp_ms, b.hash_ids, b.where) == (12.5, (0, 7), f"{f}:2")


# -- prompts: equal hash ids, equal tokens ------------------------------------------------------


def _blocks_by_id(tok: PromptTokenizer, records: list[TraceRecord], prompts: list[str], block: int) -> None:
    """Every prompt encodes to its blocks' ids in order, cut to the length, and a hash id's block
    is the same ids in every prompt it appears in: the sharing is real at the token level."""
    seen: dict[int, list[int]] = {}
    for rec, prompt in zip(records, prompts, strict=True):
        ids = tok.encode(prompt)
        assert len(ids) + tok.num_special == rec.input_length == tok.count(prompt)
        for k, h in enumerate(rec.hash_ids):
            part = ids[k * block : (k + 1) * block]
            if not part:
                break
            known = seen.setdefault(h, part)
            assert part == known[: len(part)], f"hash id {h} differs in {rec.where}"
    assert len(seen) < sum(len(r.hash_ids) for r in records)  # ids were shared, so the check bit


@pytest.mark.parametrize("which", ["bpe", "copy_tok"])
def test_equal_hash_ids_give_identical_token_blocks(request, which):
    tok = request.getfixturevalue(which)
    assert (tok.word_texts() is not None) == (which == "bpe")  # the joined path and the checked one
    records = load_trace(FIXTURE)
    prompts = [s.prompt for s in synthesize(tok, records, 16, np.random.default_rng(0))]
    _blocks_by_id(tok, records, prompts, 16)
    # A later turn starts with the whole of its session's previous prompt, as text and as tokens.
    first, later = records[0], next(r for r in records if r.hash_ids[:2] == records[0].hash_ids and r != records[0])
    i, j = records.index(first), records.index(later)
    assert prompts[j].startswith(prompts[i])
    assert tok.encode(prompts[j])[: first.input_length - tok.num_special] == tok.encode(prompts[i])


def test_a_block_is_the_same_wherever_it_appears(bpe, tmp_path):
    """A hash id at another position (or in another order of requests) gives the same tokens,
    and the last block is cut to the input length."""
    f = _write(
        tmp_path,
        {"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [5, 9, 3]},
        {"timestamp": 1, "input_length": 25, "output_length": 2, "hash_ids": [9, 5]},
    )
    a, b = synthesize(bpe, load_trace(f), 16, np.random.default_rng(1))
    ia, ib = bpe.encode(a.prompt), bpe.encode(b.prompt)
    s = bpe.num_special
    assert (len(ia), len(ib)) == (40 - s, 25 - s)
    assert ib[:16] == ia[16:32] and ib[16:] == ia[: 25 - s - 16]
    again = synthesize(bpe, load_trace(f), 16, np.random.default_rng(1))
    assert [x.prompt for x in again] == [a.prompt, b.prompt]  # seeded
    assert synthesize(bpe, load_trace(f), 16, np.random.default_rng(2))[0].prompt != a.prompt
    assert (a.prompt_len, a.output_len) == (40, 2)


def test_too_few_blocks_for_the_length_names_the_line(bpe, tmp_path):
    f = _write(tmp_path, GOOD, {**GOOD, "input_length": 40})
    with pytest.raises(TraceError, match=r"t\.jsonl:2: input_length 40 needs 3 blocks of 16 tokens, hash_ids has 2"):
        synthesize(bpe, load_trace(f), 16, np.random.default_rng(0))


# -- schedule ----------------------------------------------------------------------------------


def test_offsets_follow_the_timestamps_over_speed(tmp_path):
    f = _write(tmp_path, *({**GOOD, "timestamp": t} for t in (1000, 1500, 1500, 4000)))
    recs = load_trace(f)
    assert offsets(recs, 1.0).tolist() == [0.0, 0.5, 0.5, 3.0]
    assert offsets(recs, 2.0).tolist() == [0.0, 0.25, 0.25, 1.5]
    assert offsets(recs, 0.5).tolist() == [0.0, 1.0, 1.0, 6.0]
    with pytest.raises(ValueError, match="speed must be a positive number"):
        offsets(recs, 0.0)


def _out(due: float, late: float, duration: float) -> RequestOutput:
    o = RequestOutput(1, 1, success=True, queue_time=late)
    o.start_time, o.end_time = due + late, due + late + duration
    return o


def test_schedule_section_tells_the_caps_delay_from_the_clients():
    """On a fake clock: cap 2; requests 0 and 1 hold both slots until t=9, so request 2 (due at
    1) waits 8.5 s for the cap; request 3 (due at 20) finds a slot free and is 0.3 ms late."""
    outs = [_out(0.0, 0.0001, 9.0), _out(0.5, 0.0002, 9.5), _out(1.0, 8.5, 1.0), _out(20.0, 0.0003, 1.0)]
    offs = np.array([0.0, 0.5, 1.0, 20.0])
    s = schedule_section([*outs, RequestOutput(1, 1)], np.append(offs, 21.0), 2.0, 2)
    assert (s.requests, s.sent, s.cap, s.speed, s.span_s) == (5, 4, 2, 2.0, 21.0)
    assert (s.in_flight_max, s.cap_delayed, s.capped) == (2, 1, True)
    assert s.lateness_ms is not None and s.lateness_ms.max == 8500.0
    assert s.client_lateness_ms is not None and s.client_lateness_ms.max == 0.3
    assert s.client_lateness_ms.p50 == 0.2
    free = schedule_section(outs, offs, 1.0, 3)  # with 3 slots, nothing waited for the cap
    assert free.cap_delayed == 0 and free.client_lateness_ms == free.lateness_ms


def _wire(url: str, n: int) -> tuple[list[bytes], list[RequestOutput]]:
    target = Target.from_url(url)
    wire = [target.request_bytes(build_payload("completions", "m", f"p{i}", 2, True)) for i in range(n)]
    return wire, [RequestOutput(1, 2) for _ in range(n)]


def test_lateness_is_measured_against_a_real_server(tmp_path):
    """The fixture replayed at speed 2 against a local server: every request reached the server
    after its scheduled time (never before), the lateness the client reports is what the
    server saw less the wire's share, and with a cap above the load nothing waited for it."""
    recs = load_trace(FIXTURE)
    offs = offsets(recs, 2.0)
    with FakeServer(token_delay=0.0) as srv:
        url = srv.base_url + "/v1/completions"
        wire, outs = _wire(url, len(recs))
        run = LoadRun(url, False, wire, outs, offs, 64, 10)
        t0 = asyncio.run(_run_at(run))
        arrived = {b["prompt"]: t - t0 for b, t in zip(srv.bodies, srv.arrived, strict=True)}
    assert all(o.success for o in outs)
    at_server = np.array([arrived[f"p{i}"] - off for i, off in enumerate(offs)])
    assert np.all(at_server >= 0), at_server
    reported = np.array([o.queue_time for o in outs])
    assert np.all(reported <= at_server), (reported, at_server)  # sent before it arrived
    s = schedule_section(outs, offs, 2.0, 64)
    assert (s.sent, s.cap_delayed) == (len(recs), 0)
    assert s.lateness_ms is not None and s.lateness_ms.max == pytest.approx(reported.max() * 1000, abs=1e-3)
    assert s.span_s == pytest.approx(recs[-1].timestamp_ms / 2000)


async def _run_at(run: LoadRun) -> float:
    t0 = time.perf_counter()
    assert await run.run(30, t0=t0) is None
    return t0


def test_load_processes_report_lateness_too():
    """--workers: each process sends on its own clock from the pool's t0; the merged outputs
    carry every request's lateness, and a cap of 1 shows as cap-delayed requests."""
    offs = np.array([0.0, 0.05, 0.1, 0.15, 0.2, 0.25])

    async def go(cap: int) -> list[RequestOutput]:
        pool = WorkerPool(2, url, False)
        await pool.start()
        try:
            wire, outs = _wire(url, len(offs))
            reason, _ = await pool.run_batch(wire, outs, offs.tolist(), cap, 10, Progress(), 30, None)
            assert reason is None
            return outs
        finally:
            await pool.close()

    with FakeServer(token_delay=0.0) as srv:
        url = srv.base_url + "/v1/completions"
        outs = aio.run(go(4))
        s = schedule_section(outs, offs, 1.0, 4)
        assert s.sent == 6 and s.lateness_ms is not None and s.lateness_ms.max < 1000
        srv.token_delay = 0.2  # each request holds its slot 0.4 s: with one slot, the others wait
        slow = aio.run(go(1))
    c = schedule_section(slow, offs, 1.0, 1)
    assert c.in_flight_max == 1 and c.cap_delayed == 5 and c.capped
    assert c.lateness_ms is not None and c.lateness_ms.max > 1000  # the cap's wait, not the client's


# -- the generator -----------------------------------------------------------------------------


def test_generated_sessions_resend_their_history(tmp_path):
    s = TraceGenSettings(sessions=5, turns=4, rate=10, think_s=0.2, shared_blocks=2, first_blocks=3, new_blocks=2)
    recs = generate(s)
    assert len(recs) == 20 and [r["timestamp"] for r in recs] == sorted(r["timestamp"] for r in recs)
    assert generate(s) == recs and generate(s.model_copy(update={"seed": 1})) != recs  # seeded
    assert all(r["hash_ids"][:2] == [0, 1] for r in recs)  # every session's shared blocks
    by_session: dict[int, list[list[int]]] = {}
    for r in recs:
        by_session.setdefault(r["hash_ids"][2], []).append(r["hash_ids"])
        assert r["input_length"] == 512 * len(r["hash_ids"])
    assert len(by_session) == 5
    for turns in by_session.values():
        assert [len(t) for t in turns] == [5, 7, 9, 11]
        assert all(b[: len(a)] == a for a, b in itertools.pairwise(turns))  # history re-sent
    f = tmp_path / "g.jsonl"
    assert write_trace(f, s) == 20
    assert [r.hash_ids for r in load_trace(f)] == [tuple(r["hash_ids"]) for r in recs]
    with pytest.raises(FileExistsError):
        write_trace(f, s)  # never overwritten


def test_the_fixture_is_the_generators_output():
    lines = FIXTURE.read_text().splitlines()
    assert [json.loads(x) for x in lines] == generate(FIXTURE_SETTINGS)


def test_the_send_clock_never_wakes_a_request_early():
    """Waiters on one clock wake at or after their due times (uvloop's own timers fire up to ~1 ms
    early), in due order; a cancelled waiter (a drain) is skipped and the others still wake."""

    async def go() -> tuple[list[float], list[int], bool]:
        clock = SendClock(asyncio.get_running_loop())
        t0 = time.perf_counter() + 0.05
        dues = [t0 + 0.0037 * k for k in range(40)]
        late: list[float] = [0.0] * len(dues)
        order: list[int] = []

        async def wait(k: int) -> None:
            await clock.until(dues[k])
            late[k] = time.perf_counter() - dues[k]
            order.append(k)

        tasks = [asyncio.create_task(wait(k)) for k in reversed(range(len(dues)))]  # pushed latest first
        await asyncio.sleep(0)
        tasks[0].cancel()  # the latest one
        results = await asyncio.gather(*tasks, return_exceptions=True)
        clock.close()
        return late[:-1], order, isinstance(results[0], asyncio.CancelledError)

    late, order, cancelled = aio.run(go())
    assert cancelled and order == list(range(39))
    assert min(late) >= 0, late


def test_the_timing_benchmarks_trace_and_alignment(tmp_path):
    """benchmarks/bench_trace_timing.py: its trace is one pdbench reads back at the same offsets,
    and lateness against a client's best-aligned request is >= 0 with that request at 0 (here the
    first request is on time and every later one 3 ms late)."""
    from benchmarks.bench_trace_timing import make_trace, relative

    offs = make_trace(tmp_path / "t.jsonl", 200.0, 1.0, 0)
    recs = load_trace(tmp_path / "t.jsonl")
    assert len(recs) == 200 and offsets(recs, 1.0) == pytest.approx(offs, abs=1e-9)
    starts = (100.0 + offs + np.where(np.arange(200) > 0, 0.003, 0.0)).tolist()
    late = relative(starts, offs)
    assert late.min() == 0 and late[0] == 0 and late[1:] == pytest.approx(0.003)
