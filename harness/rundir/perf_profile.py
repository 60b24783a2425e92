"""A run's per-role performance profile (`perf_profile.json`): what `pdbench predict` fitted from
the run's own points, each fit with its error and the range of inputs it saw.

Written by `harness.predict` (pdbench predict, report), read by it again; this model is the one
definition of the format, so a reader's error names the file and the field. Times are ms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.atomic import write_text
from harness.rundir.json_model import read_model


class ProfileError(Exception):
    """A profile file that cannot be read; the message names the file and the field."""


class LinearFit(BaseModel):
    """y = intercept + slope * x, by least squares over `n` observations whose x spanned
    [x_min, x_max]; `rms_ms` is the residuals' root mean square, `r2` None where x never varied
    (slope then 0 and only the intercept is known)."""

    model_config = ConfigDict(frozen=True)
    x: str  # what x counts: prompt_tokens, decode_batch, ...
    intercept_ms: float
    slope_ms: float
    n: int = Field(ge=1)
    x_min: float
    x_max: float
    rms_ms: float = Field(ge=0)
    r2: float | None = None

    def at(self, x: float) -> float:
        return max(0.0, self.intercept_ms + self.slope_ms * x)

    def covers(self, x: float, slack: float = 0.1) -> bool:
        """Whether x lies within the profiled range (widened by `slack` of its width or value)."""
        width = max(self.x_max - self.x_min, slack * max(abs(self.x_max), 1.0))
        return self.x_min - slack * width <= x <= self.x_max + slack * width


class PerfProfile(BaseModel):
    model_config = ConfigDict(frozen=True)
    phase: Literal["disagg", "agg"]
    # Per instance: a prefill (or aggregated) worker's prompt service time vs its prompt tokens,
    # a decode (or aggregated) worker's step time vs its running batch.
    prefill: LinearFit
    decode_step: LinearFit
    kv_transfer_ms: float = Field(0.0, ge=0)  # prefill -> decode hand-off per request (disagg)
    kv_source: str = "none"  # which section of the results gave it (harness.predict.observe), or none
    overhead_ms: float = Field(0.0, ge=0)  # proxy and client time per request
    prefill_workers: int = Field(ge=1)
    decode_workers: int = Field(ge=0)  # 0: aggregated
    gpus_per_prefill_worker: int = Field(ge=0)
    gpus_per_decode_worker: int = Field(ge=0)
    # The engine's limits the predictions assume (vLLM's max_num_seqs, max_num_batched_tokens).
    max_num_seqs: int = Field(ge=1)
    max_batched_tokens: int = Field(ge=1)
    osl_range: tuple[int, int]
    concurrency_range: tuple[int, int]
    points: list[str]  # the result files it was fitted from, relative to the run directory


class ProfileFile(BaseModel):
    """The file: one profile per phase the run measured (its deployment, its aggregated baseline)."""

    model_config = ConfigDict(frozen=True)
    format: Literal[1] = 1
    profiles: list[PerfProfile]


def write(path: Path, profiles: list[PerfProfile]) -> None:
    write_text(path, ProfileFile(profiles=profiles).model_dump_json(indent=2) + "\n")


def read(path: Path) -> list[PerfProfile]:
    return read_model(path, ProfileFile, ProfileError).profiles
