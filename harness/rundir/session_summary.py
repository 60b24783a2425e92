"""A result's `sessions` section: how a point's multi-turn sessions went, turn by turn. Written by
the bench client (harness.bench.sessions), read by report; this model is the one definition of
the format, so a reader's error names the field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt, PositiveInt, model_validator


class Stats(BaseModel):
    """Mean and percentiles of one quantity; every one None when there was nothing to measure."""

    model_config = ConfigDict(frozen=True)
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


class ThinkTime(BaseModel):
    """The configured pause between an answer and the session's next turn."""

    model_config = ConfigDict(frozen=True)
    distribution: Literal["constant", "exponential", "uniform"]
    mean_s: NonNegativeFloat


class TurnStats(BaseModel):
    """The measured sessions' requests of one turn index (turn 1: the sessions' first requests)."""

    model_config = ConfigDict(frozen=True)
    turn: PositiveInt  # 1-based
    requests: NonNegativeInt  # sent
    completed: NonNegativeInt  # succeeded
    ttft_ms: Stats  # over the completed ones
    tpot_ms: Stats  # over the completed ones with two tokens or more
    prompt_tokens_mean: float | None  # the prompt as the server sees it (context growth by turn)

    @model_validator(mode="after")
    def _counts_add_up(self) -> TurnStats:
        if self.completed > self.requests:
            raise ValueError(f"turn {self.turn}: completed {self.completed} > requests {self.requests}")
        return self


class SessionSummary(BaseModel):
    """Sessions: each a chain of turns whose prompt is the whole conversation so far, so a later
    turn shares its start with the turn before it (what a prefix cache can reuse)."""

    model_config = ConfigDict(frozen=True)
    turns: PositiveInt  # configured turns per session
    sessions_started: NonNegativeInt  # measured sessions whose first turn was sent
    sessions_completed: NonNegativeInt  # every turn succeeded
    think_time: ThinkTime
    by_turn: tuple[TurnStats, ...]  # turn 1, 2, ..., `turns`: one entry each, requests 0 where none was sent
    session_duration_s: Stats  # a completed session's first send to its last answer, think times included
    sentinels: str  # how the point's sentinels ran beside the sessions, or why they did not

    @model_validator(mode="after")
    def _consistent(self) -> SessionSummary:
        if self.sessions_completed > self.sessions_started:
            raise ValueError(f"sessions_completed {self.sessions_completed} > sessions_started {self.sessions_started}")
        if [t.turn for t in self.by_turn] != list(range(1, self.turns + 1)):
            raise ValueError(f"by_turn must hold turns 1 to {self.turns} in order")
        return self
