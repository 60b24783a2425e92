"""The winner per SLO, its ties and baseline, the device-hours spent against the grid's; and the
t-interval they rest on."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.interval import Interval, t_interval
from harness.search.decide import choose, spend
from harness.search.outcome import EXCLUDED, CandidateOutcome, Cost, Limit, ReportEntry, SLOOutcome
from harness.search.space import Candidate


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


def cand(p: int, d: int, kind: str = "disagg") -> Candidate:
    if kind == "agg":
        return Candidate(f"agg-{p}", "agg", (), p, 0, 1, {"aggregated": float(p)})
    return Candidate(f"{p}p{d}d", "disagg", (), p, d, p + d, {"prefill": float(p), "decode": float(d)})


def entry(
    c: Candidate,
    samples: list[float] | None,
    *,
    status: str = "done",
    cost: Cost | None = None,
    earlier: tuple[CandidateOutcome, ...] = (),
) -> ReportEntry:
    """A candidate that ran (samples at its best point under `tight`, [] when nothing met it), or
    did not (None)."""
    if samples is None:
        return ReportEntry(c, status, "skipped: ...", None, None, earlier)
    limit = Limit("decode", 6, ("tpot",), ("tpot_p90 45.0 ms > 40 ms",))
    slo = SLOOutcome(4 if samples else None, tuple(samples), t_interval(samples) if samples else None, limit, None)
    cost = cost or Cost(100.0, c.devices * 100.0 / 3600, 30.0, 10.0, 7)
    out = CandidateOutcome(c.name, c.devices, "succeeded", None, True, {"tight": slo}, (), cost)
    return ReportEntry(c, status, "ran: ...", Path("runs") / c.name, out, earlier)


def test_the_winner_its_baseline_and_ratio() -> None:
    entries = [
        entry(cand(1, 1), [98.0, 100.0, 102.0]),
        entry(cand(1, 2), [120.0, 121.0, 122.0]),
        entry(cand(3, 0, "agg"), [60.0, 60.5, 61.0]),
    ]
    choice = choose(entries, "tight")
    assert choice.winner is not None and choice.winner.name == "1p2d" and choice.winner.concurrency == 4
    assert choice.ties == ()
    assert choice.baseline is not None and choice.baseline.name == "agg-3"
    assert choice.ratio == pytest.approx(121.0 / 60.5)
    assert choice.text().startswith("tight: winner 1p2d at c=4, 121.0 ± 2.5 tok/s/device; aggregated baseline agg-3")


def test_overlapping_intervals_are_a_tie() -> None:
    entries = [
        entry(cand(1, 1), [98.0, 100.0, 102.0]),
        entry(cand(1, 2), [99.0, 101.0, 103.0]),
        entry(cand(2, 1), [1.0, 1.0]),
    ]
    choice = choose(entries, "tight")
    assert choice.winner is not None and choice.winner.name == "1p2d"
    assert [t.name for t in choice.ties] == ["1p1d"]
    assert choice.to_json()["tie"] is True
    assert choice.text().startswith("tight: a tie: 1p2d")


def test_the_baseline_is_not_a_winner_and_must_match_the_device_count() -> None:
    entries = [entry(cand(1, 1), [98.0, 100.0, 102.0]), entry(cand(4, 0, "agg"), [500.0, 500.0])]
    choice = choose(entries, "tight")
    assert choice.winner is not None and choice.winner.name == "1p1d"
    assert choice.baseline is None and choice.ratio is None
    assert choice.notes == ("no aggregated baseline with 2 devices (ran: agg-4 (4))",)


def test_no_candidate_meets() -> None:
    choice = choose([entry(cand(1, 1), []), entry(cand(1, 2), None, status="skipped")], "tight")
    assert choice.winner is None
    assert choice.text() == "tight: no winner: no disaggregated candidate meets it at any measured concurrency"


def test_device_hours_spent_against_the_grid() -> None:
    """Ran: 1P1D (2 devices) and its baseline (2), each 100 s; a failed earlier 1P1D job 50 s. 1P2D
    was pruned, 2P2D excluded. The grid: 1P1D, 1P2D and the baseline, each once over 6 points:
    (2 + 3 + 2) x (30 + 6 x 10) s."""
    failed = CandidateOutcome("1p1d", 2, "failed", "boom", False, {}, (), Cost(50.0, 2 * 50.0 / 3600, None, None, 0))
    entries = [
        entry(cand(1, 1), [100.0, 101.0], earlier=(failed,)),
        entry(cand(1, 2), None, status="skipped"),
        entry(cand(2, 2), None, status=EXCLUDED),
        entry(cand(2, 0, "agg"), [50.0, 51.0]),
    ]
    s = spend(entries, [1, 2, 3, 4, 6, 8])
    assert s.jobs == 3
    assert s.device_hours == pytest.approx((200 + 100 + 200) / 3600)
    assert (s.mean_startup_s, s.mean_per_point_s) == (30.0, 10.0)
    assert s.grid_jobs == 3
    assert s.grid_device_hours == pytest.approx(7 * (30 + 6 * 10) / 3600)
    assert "the full grid by hand (3 jobs × 6 points, no repeats): about 0.175 device-hours" in s.text()


def test_nothing_measured_has_no_grid_estimate() -> None:
    unknown = Cost(None, None, None, None, 0)
    s = spend([entry(cand(1, 1), [], cost=unknown), entry(cand(1, 2), None, status="planned")], [1, 2])
    assert s.device_hours == 0.0 and s.cost_unknown == ("1p1d",) and s.grid_device_hours is None
    assert s.text() == (
        "0.000 device-hours over 1 job (cost not recorded: 1p1d); the full grid's estimate needs a measured job"
    )


def test_a_winner_measured_once_ties_with_all_and_says_why() -> None:
    choice = choose([entry(cand(1, 1), [100.0]), entry(cand(1, 2), [50.0, 51.0])], "tight")
    assert choice.winner is not None and choice.winner.name == "1p1d" and [t.name for t in choice.ties] == ["1p2d"]
    assert "1p1d was measured once: its interval is unknown, so it ties with every candidate meeting the SLO" in (
        choice.notes
    )
