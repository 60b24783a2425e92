"""A run's prediction made before it ran (`prediction.json`): per ladder point, what the search
predicted from another run's profile (harness.search.foresee), so that the report can set it
beside what the run then measured.

Written by `pdbench search` when it launches a candidate it predicted, read by `pdbench report`;
this model is the one definition of the format, so a reader's error names the file and the field.
Times are ms, throughput total tokens/s per device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from harness.atomic import write_text
from harness.rundir.json_model import read_model
from harness.strict import FrozenStrict


class PredictionError(Exception):
    """A prediction file that cannot be read; the message names the file and the field."""


class PredictedPoint(FrozenStrict):
    concurrency: int = Field(ge=1)
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    ttft_p90_ms: float = Field(ge=0)
    tpot_mean_ms: float = Field(ge=0)
    goodput_per_device: float = Field(ge=0)
    band: float = Field(ge=0)  # the relative half-width of the prediction
    extrapolating: list[str] = Field(default_factory=list)


class PriorPrediction(FrozenStrict):
    format: Literal[1] = 1
    made_at: float  # unix time, before the run's job was launched
    source: str  # the run whose profile predicted it (for a search: relative to its directory)
    by: str  # what made it: "pdbench search <name>"
    points: list[PredictedPoint]


def write(path: Path, prediction: PriorPrediction) -> None:
    write_text(path, prediction.model_dump_json(indent=2) + "\n")


def read(path: Path) -> PriorPrediction:
    return read_model(path, PriorPrediction, PredictionError)
