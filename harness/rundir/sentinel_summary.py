"""A result's `sentinels` section: how a point's sentinel prompts were answered against the
reference. Written by the bench client (harness.bench.sentinels), read by report; this model is
the one definition of the format, so a reader's error names the field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeInt, model_validator


class Tolerance(BaseModel):
    model_config = ConfigDict(frozen=True)
    match_tokens: NonNegativeInt | None  # the first N tokens must be equal; None: every token
    max_diverged: NonNegativeInt  # sentinels of the point that may diverge beyond match_tokens


class SentinelSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    reference: str  # which path answered them whole, in words
    sent: NonNegativeInt
    answered: NonNegativeInt  # their requests succeeded
    compared: NonNegativeInt  # answered, and the reference answered them too
    exact: NonNegativeInt  # equal in every token
    matched: NonNegativeInt  # equal within the tolerance
    match_rate: float | None  # matched / compared; None when nothing was compared
    first_divergence: tuple[NonNegativeInt | None, ...]  # per sentinel sent, in send order; None: equal
    unit: Literal["token", "character"] | None  # of the positions: characters where no token ids came back
    tolerance: Tolerance
    record: str | None  # every prompt and both answers, relative to the run directory

    @model_validator(mode="after")
    def _counts_add_up(self) -> SentinelSummary:
        if not self.exact <= self.matched <= self.compared <= self.answered <= self.sent:
            raise ValueError(
                f"counts do not add up: need exact <= matched <= compared <= answered <= sent, got {self.exact}, "
                f"{self.matched}, {self.compared}, {self.answered}, {self.sent}"
            )
        if self.match_rate is not None and not 0 <= self.match_rate <= 1:
            raise ValueError(f"match_rate {self.match_rate} is not within [0, 1]")
        return self
