"""The recipe surface of sessions and trace replay: defaults, sizes and the errors a user sees."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.config.benchmark import BenchmarkSettings, SessionSettings, TraceSettings


def _settings(**kw: object) -> BenchmarkSettings:
    return BenchmarkSettings.model_validate({"isl": 64, "osl": 8, "concurrency": [2], **kw})


def _error(**kw: object) -> str:
    with pytest.raises(ValidationError) as e:
        _settings(**kw)
    return str(e.value)


def test_sessions_take_their_defaults_and_size_a_point_in_turns() -> None:
    b = _settings(dataset="sessions")
    assert b.sessions == SessionSettings()
    assert b.sessions.turns == 4
    # 2 x concurrency sessions, at least 4, each of 4 turns; warmups: one session per slot.
    assert b.num_prompts_for(2) == 4 * 4
    assert b.num_prompts_for(8) == 16 * 4
    assert b.num_warmups_for(2) == 2 * 4
    # Written and read back (a job hands the client its settings as JSON): the same settings.
    assert BenchmarkSettings.model_validate_json(b.model_dump_json()) == b


def test_a_session_point_is_bounded_by_its_turns_and_think_times() -> None:
    b = _settings(
        dataset="sessions",
        request_timeout_s=10,
        sessions={"turns": 3, "num_sessions": 4, "think_time_s": 2, "think_time_distribution": "uniform"},
    )
    # 4 sessions on 2 slots: 2 rounds of 3 turns (and 2 pauses of at most 4 s), plus one request's bound.
    assert b.point_timeout_for(b.num_prompts_for(2), 2) == (2 * 3 + 1) * 10 + 2 * 2 * 4


def test_trace_takes_its_defaults() -> None:
    b = _settings(dataset="mooncake_trace", dataset_path="t.jsonl")
    assert b.trace == TraceSettings(speed=1.0, block_tokens=512, max_requests=None)


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"dataset": "sessions", "isl": None, "osl": None}, "isl is the first turn's prompt"),
        ({"dataset": "sessions", "request_rate": 4}, "do not apply to dataset 'sessions'"),
        ({"dataset": "sessions", "num_prompts": 10}, "sessions.num_sessions"),
        ({"dataset": "sessions", "num_warmups": 1}, "sessions.num_warmup_sessions"),
        ({"dataset": "sessions", "workers": 2}, "runs in one load process"),
        ({"dataset": "sessions", "dataset_path": "x.jsonl"}, "dataset_path is only for dataset"),
        ({"dataset": "sessions", "sessions": {"turn": 3}}, "sessions.turn"),
        ({"dataset": "sessions", "sessions": {"turns": 0}}, "sessions.turns"),
        ({"sessions": {"turns": 2}}, "only for dataset 'sessions'"),
        ({"dataset": "mooncake_trace"}, "needs dataset_path"),
        ({"dataset": "mooncake_trace", "dataset_path": "t", "burstiness": 0.5}, "scale them with trace.speed"),
        ({"dataset": "mooncake_trace", "dataset_path": "t", "random_prefix_len": 8}, "hash ids make the prefixes"),
        ({"dataset": "mooncake_trace", "dataset_path": "t", "trace": {"speed": 0}}, "trace.speed"),
        ({"trace": {"speed": 2}}, "only for dataset 'mooncake_trace'"),
    ],
)
def test_a_misplaced_setting_is_refused_by_name(kw: dict[str, object], words: str) -> None:
    assert words in _error(**kw)
