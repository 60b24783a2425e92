"""The pruning rule: a measured candidate's limit side bounds the goodput per device of one not run
yet; it is skipped only when every SLO's bound is below what a finished candidate surely reaches."""

from __future__ import annotations

import math

import pytest

from harness.interval import t_interval
from harness.search.outcome import CandidateOutcome, Cost, Limit, SLOOutcome
from harness.search.prune import ASSUMPTION, next_decision
from harness.search.space import Candidate

SLOS = {"tight": {"tpot_p90": 40.0}}


def cand(p: int, d: int, kind: str = "disagg") -> Candidate:
    if kind == "agg":
        return Candidate(f"agg-{p}", "agg", (), p, 0, 1, {"aggregated": float(p)})
    return Candidate(f"{p}p{d}d", "disagg", (), p, d, p + d, {"prefill": float(p), "decode": float(d)})


def outcome(c: Candidate, samples: dict[str, list[float]], side: str = "decode") -> CandidateOutcome:
    """A finished candidate: per SLO its goodput-per-device samples at the best point, limited on `side`."""
    slos = {
        name: SLOOutcome(4, tuple(s), t_interval(s), Limit(side, 6, ("tpot",), ("tpot_p90 45.0 ms > 40 ms",)), 4)
        for name, s in samples.items()
    }
    cost = Cost(100.0, c.devices * 100.0 / 3600, 30.0, 10.0, 7)
    return CandidateOutcome(c.name, c.devices, "succeeded", None, True, slos, (), cost)


def test_nothing_measured_runs_it() -> None:
    d = next_decision(cand(1, 2), [], SLOS, 1.1)
    assert d.run and d.reason == "ran: nothing measured bounds it yet (tight)"


def test_a_decode_bound_candidate_rules_out_one_that_only_adds_prefill() -> None:
    """1P1D decode-bound at 100 tok/s/device (200 in all, ± 2): 2P1D has the same decode, so at
    most 200 x 1 x 1.1 / 3 = 73.3 per device, below 1P1D's 98.0."""
    m = cand(1, 1)
    finished = [(m, outcome(m, {"tight": [98.0, 100.0, 102.0]}))]
    d = next_decision(cand(2, 1), finished, SLOS, 1.1)
    low = 100.0 - t_interval([98.0, 100.0, 102.0]).half_width
    assert not d.run
    assert d.reason == (
        "skipped: decode-bound 1p1d bounds it at <= 73.3 tok/s/device (tight), below 1p1d's 100.0 ± 5.0 "
        f"(slack 1.1, {ASSUMPTION})"
    )
    assert low > 73.3


def test_more_of_the_limiting_role_runs() -> None:
    """1P2D doubles the decode that limited 1P1D: bound 200 x 2 x 1.1 / 3 = 146.7 >= 95.0."""
    m = cand(1, 1)
    finished = [(m, outcome(m, {"tight": [98.0, 100.0, 102.0]}))]
    d = next_decision(cand(1, 2), finished, SLOS, 1.1)
    assert d.run
    assert d.reason.startswith("ran: bound 146.7 >= 95.0 (tight: decode-bound 1p1d bounds it at <= 146.7")
    assert ASSUMPTION in d.reason


def test_the_tightest_bound_is_used() -> None:
    """1P1D (decode-bound) bounds 2P2D at 200 x 2 x 1.1 / 4 = 110; 1P2D (prefill-bound, 150 per
    device = 450) at 450 x 2 x 1.1 / 4 = 247.5: the tighter is 110 >= 95, it runs."""
    a, b = cand(1, 1), cand(1, 2)
    finished = [(a, outcome(a, {"tight": [98.0, 100.0, 102.0]})), (b, outcome(b, {"tight": [150.0]}, "prefill"))]
    d = next_decision(cand(2, 2), finished, SLOS, 1.1)
    assert d.run and d.reason.startswith("ran: bound 110.0 >= 95.0 (tight: decode-bound 1p1d")


def test_every_slo_must_rule_it_out() -> None:
    """Bounded below the incumbent under tight, but nothing bounds it under loose: it runs."""
    m = cand(1, 1)
    out = outcome(m, {"tight": [98.0, 100.0, 102.0]})
    loose = SLOOutcome(8, (120.0,), t_interval([120.0]), Limit("unknown", None, (), ("no limit seen",)), 8)
    out = CandidateOutcome(m.name, 2, "succeeded", None, True, {**out.slos, "loose": loose}, (), out.cost)
    slos = {**SLOS, "loose": {"ttft_p90": 3000.0}}
    d = next_decision(cand(2, 1), [(m, out)], slos, 1.1)
    assert d.run and d.reason == "ran: nothing measured bounds it yet (loose)"


def test_one_sample_rules_nothing_out() -> None:
    m = cand(1, 1)
    finished = [(m, outcome(m, {"tight": [100.0]}))]
    d = next_decision(cand(2, 1), finished, SLOS, 1.1)
    assert math.isinf(finished[0][1].slos["tight"].interval.half_width)
    assert d.run and "no finished candidate surely meets tight" in d.reason


def test_the_baseline_is_never_pruned() -> None:
    m = cand(1, 1)
    finished = [(m, outcome(m, {"tight": [998.0, 1000.0, 1002.0]}))]
    d = next_decision(cand(1, 0, "agg"), finished, SLOS, 1.0)
    assert d.run and d.reason == "ran: the aggregated baseline is never pruned"


def test_an_unknown_limit_or_the_baseline_bounds_nothing() -> None:
    m, agg = cand(1, 1), cand(2, 0, "agg")
    finished = [(m, outcome(m, {"tight": [98.0, 100.0, 102.0]}, "unknown")), (agg, outcome(agg, {"tight": [1.0, 1.0]}))]
    d = next_decision(cand(2, 1), finished, SLOS, 1.1)
    assert d.run and d.reason == "ran: nothing measured bounds it yet (tight)"


def test_a_slack_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="slack"):
        next_decision(cand(1, 1), [], SLOS, 0.9)
