"""The confidence interval of a mean over a few samples: Student's t. One owner for the SLO
ladder inside a job (when a point's repeats are tight enough) and the search (a candidate's
goodput per device, ties, pruning).

A point is measured a few times (the first measurement and its repeats); the samples are few,
so the interval is the t-interval mean ± t(confidence, n-1) · s / √n, with
s the sample standard deviation. One sample says nothing about the spread: its half-width is
infinite (unknown), and it overlaps every interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Interval:
    """mean ± half_width at `confidence` over n samples; half_width is inf when n == 1."""

    n: int
    mean: float
    half_width: float
    confidence: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def relative(self) -> float:
        """half_width / mean: inf when either is unknown or the mean is not positive."""
        if not math.isfinite(self.half_width) or self.mean <= 0:
            return math.inf
        return self.half_width / self.mean

    def overlaps(self, other: Interval) -> bool:
        """Whether the two intervals share a value (an unknown half-width overlaps everything)."""
        return self.low <= other.high and other.low <= self.high

    def text(self, digits: int = 1) -> str:
        """'55.0 ± 1.1' (one sample: '55.0 ± ?')."""
        hw = f"{self.half_width:.{digits}f}" if math.isfinite(self.half_width) else "?"
        return f"{self.mean:.{digits}f} ± {hw}"

    def to_json(self) -> dict[str, Any]:
        # JSON has no infinity: an unknown half-width is null.
        finite = math.isfinite(self.half_width)
        return {
            "n": self.n,
            "mean": self.mean,
            "half_width": self.half_width if finite else None,
            "relative": self.relative if finite and math.isfinite(self.relative) else None,
            "confidence": self.confidence,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Interval:
        hw = data.get("half_width")
        return cls(
            int(data["n"]), float(data["mean"]), math.inf if hw is None else float(hw), float(data["confidence"])
        )


def t_interval(samples: Sequence[float], confidence: float = 0.95) -> Interval:
    """The two-sided t-interval of the samples' mean at `confidence` (0 < confidence < 1)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    values = [float(s) for s in samples]
    if not values:
        raise ValueError("no samples: an interval needs at least one")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"samples must be finite numbers, got {values!r}")
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return Interval(1, mean, math.inf, confidence)
    from scipy.stats import t  # imported here: only a point with repeats needs scipy

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return Interval(n, mean, float(t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n), confidence)
