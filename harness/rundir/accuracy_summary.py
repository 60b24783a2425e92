"""One accuracy eval's verdict (evals/<phase>-<when>/pdbench-accuracy.json). Written by node 0's
eval step (harness.evals), read by report and status; this model is the one definition of the
format, so a reader's error names the field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt, PositiveInt, computed_field


class TaskScore(BaseModel):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)
    task: str
    metric: str  # lm-eval's metric key, e.g. "exact_match,strict-match"
    score: float | None  # None: lm-eval wrote none
    stderr: float | None  # None: lm-eval could not compute it ("N/A", one sample)
    threshold: float | None
    passed: bool | None  # None without a threshold; a missing score fails one
    samples: NonNegativeInt | None  # lm-eval's effective sample count


class AccuracySummary(BaseModel):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)
    phase: Literal["disagg", "aggregated"]
    when: Literal["before", "after"]
    concurrency: PositiveInt
    lm_eval_version: str
    base_url: str
    elapsed_s: NonNegativeFloat
    tasks: tuple[TaskScore, ...]
    error: str | None

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented use on a property
    @property
    def passed(self) -> bool | None:
        """False on an error or a task under its threshold; None when nothing was judged."""
        if self.error is not None or any(t.passed is False for t in self.tasks):
            return False
        return True if any(t.passed for t in self.tasks) else None
