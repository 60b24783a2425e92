"""The winner per SLO, its ties and baseline, the device-hours spent against the grid's; and the
t-interval they rest on."""

from __future__ import annotations

import math

import pytest

from harness.search.stats import Interval, t_interval


def test_the_t_interval_of_a_few_samples() -> None:
    iv = t_interval([1.0, 2.0, 3.0], 0.95)
    # mean 2, sd 1, t(0.975, 2) = 4.302653
    assert (iv.n, iv.mean) == (3, 2.0)
    assert iv.half_width == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert iv.relative == pytest.approx(iv.half_width / 2.0)
    assert t_interval([1.0, 2.0, 3.0], 0.90).half_width < iv.half_width
    assert t_interval([5.0, 5.0], 0.95).half_width == 0.0


def test_one_sample_has_an_unknown_half_width() -> None:
    iv = t_interval([55.0])
    assert iv.n == 1 and math.isinf(iv.half_width) and math.isinf(iv.relative)
    assert iv.overlaps(t_interval([1.0, 1.1, 0.9]))
    assert iv.text() == "55.0 ± ?"
    assert iv.to_json()["half_width"] is None
    assert Interval.from_json(iv.to_json()) == iv


def test_overlap() -> None:
    a, b, c = Interval(3, 55.0, 1.1, 0.95), Interval(3, 53.5, 0.5, 0.95), Interval(3, 50.0, 2.0, 0.95)
    assert a.overlaps(b) and b.overlaps(a)
    assert not a.overlaps(c) and not c.overlaps(a)
    assert a.text() == "55.0 ± 1.1"


@pytest.mark.parametrize(("samples", "confidence"), [([], 0.95), ([1.0], 1.0), ([1.0], 0.0), ([math.nan], 0.95)])
def test_bad_input_is_refused(samples: list[float], confidence: float) -> None:
    with pytest.raises(ValueError):
        t_interval(samples, confidence)
