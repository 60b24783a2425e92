"""Student's t interval of a mean (harness.interval), shared by the SLO ladder and the search."""

from __future__ import annotations

import math

import pytest

from harness.interval import Interval, t_interval


def test_the_interval_is_students_t() -> None:
    iv = t_interval([10.0, 12.0], 0.95)
    # t(0.975, 1) = 12.706; sd = sqrt(2); half = 12.706 * sqrt(2) / sqrt(2).
    assert iv.n == 2 and iv.mean == 11.0 and iv.half_width == pytest.approx(12.7062, rel=1e-4)
    assert iv.relative == pytest.approx(12.7062 / 11, rel=1e-4)
    assert (iv.low, iv.high) == pytest.approx((11 - 12.7062, 11 + 12.7062), rel=1e-4)


def test_one_sample_or_a_zero_mean_has_no_relative_width() -> None:
    one = t_interval([5.0], 0.95)
    assert (one.mean, one.half_width, one.relative) == (5.0, math.inf, math.inf)
    assert one.to_json()["half_width"] is None and one.to_json()["relative"] is None  # strict JSON
    assert t_interval([0.0, 0.0], 0.95).relative == math.inf


def test_overlap_and_round_trip() -> None:
    a, b = t_interval([100.0, 102.0, 101.0]), t_interval([90.0, 91.0, 89.0])
    assert not a.overlaps(b) and a.overlaps(t_interval([100.0]))  # one sample overlaps everything
    assert Interval.from_json(a.to_json()) == a


@pytest.mark.parametrize("bad", [[], [1.0, math.nan]])
def test_bad_samples_are_refused(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        t_interval(bad)
