"""A run's prediction made before it ran (`prediction.json`): per point, what was predicted from
another run's profile, so that each result and the report can set it beside what the run then
measured.

Written by `pdbench search` when it launches a candidate it predicted (harness.search.foresee) and
by `pdbench submit` (harness.predict.before_run); read by the bench, which writes each point's
check into its result (`metadata.prediction`), and by `pdbench report`. This model is the one
definition of the format and of the check, so a reader's error names the file and the field.
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
    # The serving the point predicts (a job may measure its aggregated baseline too); None: any.
    phase: Literal["disagg", "agg"] | None = None

    def matches(self, concurrency: int, isl: int | None, osl: int | None, phase: str) -> bool:
        return (self.concurrency, self.isl, self.osl) == (concurrency, isl, osl) and self.phase in (None, phase)

    def check(
        self,
        ttft_p90_ms: float | None,
        tpot_mean_ms: float | None,
        per_device: float | None,
        prior: PriorPrediction | None = None,
    ) -> PointCheck:
        """The point's prediction (of `prior`) against what it measured: err = (predicted -
        measured) / measured."""
        return PointCheck(
            predicted={
                "ttft_p90_ms": self.ttft_p90_ms,
                "tpot_mean_ms": self.tpot_mean_ms,
                "goodput_per_device": self.goodput_per_device,
            },
            measured={"ttft_p90_ms": ttft_p90_ms, "tpot_mean_ms": tpot_mean_ms, "goodput_per_device": per_device},
            band=self.band,
            extrapolating=self.extrapolating,
            source=prior.source if prior else None,
            by=prior.by if prior else None,
        )


def _error(pred: float, meas: float | None) -> float | None:
    return None if meas is None or meas == 0 else (pred - meas) / meas


class PointCheck(FrozenStrict):
    """One point's prediction and measurement as its result file keeps them (metadata.prediction)."""

    predicted: dict[str, float]
    measured: dict[str, float | None]
    band: float
    extrapolating: list[str] = Field(default_factory=list)
    source: str | None = None  # the run whose profile predicted it
    by: str | None = None

    @property
    def error(self) -> dict[str, float | None]:
        return {k: _error(v, self.measured.get(k)) for k, v in self.predicted.items()}

    @property
    def inside(self) -> bool | None:
        """Whether the measured goodput per device fell within the prediction's band."""
        pred, meas = self.predicted["goodput_per_device"], self.measured.get("goodput_per_device")
        return None if not meas else abs(pred - meas) <= self.band * pred

    def record(self) -> dict[str, object]:
        """What a result file keeps: the check with its errors and verdict."""
        return self.model_dump(mode="json") | {"error": self.error, "inside": self.inside}


class PriorPrediction(FrozenStrict):
    format: Literal[1] = 1
    made_at: float  # unix time, before the run's job was launched
    source: str  # the run whose profile predicted it (for a search: relative to its directory)
    by: str  # what made it: "pdbench search <name>"
    points: list[PredictedPoint]

    def point(self, concurrency: int, isl: int | None, osl: int | None, phase: str) -> PredictedPoint | None:
        return next((p for p in self.points if p.matches(concurrency, isl, osl, phase)), None)


def write(path: Path, prediction: PriorPrediction) -> None:
    write_text(path, prediction.model_dump_json(indent=2) + "\n")


def read(path: Path) -> PriorPrediction:
    return read_model(path, PriorPrediction, PredictionError)
