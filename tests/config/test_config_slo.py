"""SLO keys and the judgement of one point (harness.config.slo)."""

from __future__ import annotations

import pytest

from harness.config.slo import SLOError, check_bounds, result_key, violated_metrics, violations


@pytest.mark.parametrize(
    ("key", "column"),
    [
        ("ttft_p90", "p90_ttft_ms"),
        ("tpot_p50", "median_tpot_ms"),
        ("e2el_mean", "mean_e2el_ms"),
        ("itl_p99.9", "p99.9_itl_ms"),
    ],
)
def test_keys_name_the_result_columns(key: str, column: str) -> None:
    assert result_key(key) == column


@pytest.mark.parametrize("key", ["ttft", "latency_p90", "ttft_p", "ttft_max", "tpot_p90_ms"])
def test_a_bad_key_is_named(key: str) -> None:
    with pytest.raises(SLOError, match="metric one of ttft, tpot, itl, e2el"):
        result_key(key)


def test_bounds_are_checked_with_their_place() -> None:
    assert check_bounds({"TTFT_P90": 2000, "tpot_p90": 50.5}) == {"ttft_p90": 2000.0, "tpot_p90": 50.5}
    with pytest.raises(SLOError, match=r"slos\.fast\.ttft_p90: the bound must be a positive number"):
        check_bounds({"ttft_p90": 0}, "slos.fast")
    with pytest.raises(SLOError, match=r"slos\.fast\.ttft_p90: the bound must be"):
        check_bounds({"ttft_p90": True}, "slos.fast")
    with pytest.raises(SLOError, match=r"slos\.fast\.speed: "):
        check_bounds({"speed": 3}, "slos.fast")
    with pytest.raises(SLOError, match="no bound given"):
        check_bounds({}, "slos.fast")


def test_a_point_meets_or_names_each_violation() -> None:
    bounds = {"ttft_p90": 100.0, "tpot_p90": 10.0}
    point = {"p90_ttft_ms": 99.0, "p90_tpot_ms": 10.0}
    assert violations(bounds, point) == [] and violated_metrics(bounds, point) == set()
    slow = {"p90_ttft_ms": 150.0, "p90_tpot_ms": 10.0}
    assert violations(bounds, slow) == ["ttft_p90 150.0 ms > 100 ms"]
    assert violated_metrics(bounds, slow) == {"ttft"}
    # A key the result lacks is not met: nothing shows it is.
    assert violations(bounds, {"p90_ttft_ms": 1.0}) == ["tpot_p90: the result has no p90_tpot_ms"]
    assert violated_metrics(bounds, {"p90_ttft_ms": float("nan"), "p90_tpot_ms": 1.0}) == {"ttft"}
