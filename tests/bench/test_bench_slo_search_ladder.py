"""The SLO ladder's decisions (harness.bench.slo_ladder) on every branch, with points whose
verdicts a test fixes: a point meets an SLO below a concurrency the test chooses."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.bench.slo_ladder import Bracket, Ladder, repeats_stop

LADDER = [1, 2, 3, 4, 6, 8]


def search(ladder: Ladder, meets: Callable[[int], dict[str, bool]]) -> list[tuple[int, str]]:
    """Measure what the ladder asks until it asks nothing; the steps in order."""
    steps: list[tuple[int, str]] = []
    for _ in range(len(ladder.ladder) + 1):  # every point at most once
        step = ladder.next()
        if step is None:
            return steps
        steps.append((step.concurrency, step.why))
        ladder.record(step.concurrency, meets(step.concurrency))
    raise AssertionError(f"the search did not end: {steps}")


def below(limit: int) -> Callable[[int], dict[str, bool]]:
    return lambda c: {"s": c <= limit}


def test_the_top_of_the_ladder_meets() -> None:
    lad = Ladder(LADDER, ["s"], 1)
    assert search(lad, below(100)) == [(1, "start"), (2, "up"), (4, "up"), (8, "up")]
    assert lad.bracket("s") == Bracket(8, None)


def test_the_first_failure_is_bisected() -> None:
    lad = Ladder(LADDER, ["s"], 1)
    # 1, 2, 4 meet; 8 fails; between index 3 (4) and 5 (8) lies 6, which fails.
    assert search(lad, below(4)) == [(1, "start"), (2, "up"), (4, "up"), (8, "up"), (6, "bisect")]
    assert lad.bracket("s") == Bracket(4, 6)
    lad = Ladder(LADDER, ["s"], 1)
    assert search(lad, below(2))[-2:] == [(4, "up"), (3, "bisect")]
    assert lad.bracket("s") == Bracket(2, 3)


def test_no_value_twice_the_last_goes_to_the_top() -> None:
    lad = Ladder([1, 2, 3], ["s"], 2)  # nothing >= 4: the top, 3
    assert search(lad, below(2)) == [(2, "start"), (3, "up")]
    assert lad.bracket("s") == Bracket(2, 3)


def test_a_failing_start_is_bisected_down() -> None:
    lad = Ladder(LADDER, ["s"], 6)
    # Indices -1 (none meets) .. 4 (6): 2 (index 1) meets, then 3 (index 2), then 4 (index 3) fails.
    assert search(lad, below(3)) == [(6, "start"), (2, "bisect"), (3, "bisect"), (4, "bisect")]
    assert lad.bracket("s") == Bracket(3, 4)
    lad = Ladder(LADDER, ["s"], 6)
    assert search(lad, below(0)) == [(6, "start"), (2, "bisect"), (1, "bisect")]
    assert lad.bracket("s") == Bracket(None, 1)


def test_two_slos_share_their_points() -> None:
    lad = Ladder(LADDER, ["tight", "loose"], 1)
    steps = search(lad, lambda c: {"tight": c <= 2, "loose": c <= 6})
    # tight: 1, 2, 4 (fails), 3 (bisect, fails). loose reuses 1, 2, 4, goes up to 8, bisects to 6.
    assert steps == [(1, "start"), (2, "up"), (4, "up"), (3, "bisect"), (8, "up"), (6, "bisect")]
    assert lad.bracket("tight") == Bracket(2, 3) and lad.bracket("loose") == Bracket(6, 8)
    assert len({c for c, _ in steps}) == len(steps)  # no point measured twice


def test_a_point_that_fails_every_slo_never_counts_as_meeting() -> None:
    # An invalid point or one with failed requests is recorded as meeting no SLO, whatever its
    # latencies (the sweep judges it so): here C=2 is such a point inside an otherwise-met range.
    lad = Ladder(LADDER, ["s"], 1)
    steps = search(lad, lambda c: {"s": c != 2 and c <= 8})
    assert steps == [(1, "start"), (2, "up")]
    assert lad.bracket("s") == Bracket(1, 2)


def test_bad_ladders_are_refused() -> None:
    with pytest.raises(ValueError, match="ascends"):
        Ladder([2, 1], ["s"], 1)
    with pytest.raises(ValueError, match="not on the ladder"):
        Ladder([1, 2], ["s"], 3)


def test_repeats_stop_when_tight_or_at_max() -> None:
    assert repeats_stop([100.0], 0, 2, 0.03, 0.95) is None  # one sample: no interval yet
    assert repeats_stop([100.0, 100.2], 1, 2, 0.03, 0.95) == "tight"  # 1.3 % of the mean
    assert repeats_stop([100.0, 130.0], 1, 2, 0.03, 0.95) is None  # wide, one repeat of two made
    assert repeats_stop([100.0, 130.0, 70.0], 2, 2, 0.03, 0.95) == "max"
    assert repeats_stop([100.0], 0, 0, 0.03, 0.95) == "max"  # no repeats asked for
    assert repeats_stop([0.0, 0.0], 1, 1, 0.03, 0.95) == "max"  # nothing served: never tight
    assert repeats_stop([], 2, 2, 0.03, 0.95) == "max"  # no goodput known (devices unknown): bounded all the same


def test_an_invalid_point_or_one_with_failed_requests_meets_no_slo() -> None:
    from harness.bench.slo_record import goodput_per_device, judge

    slos = {"tight": {"ttft_p90": 100.0}, "loose": {"ttft_p90": 1000.0}}
    fine = {
        "p90_ttft_ms": 50.0,
        "failed": 0,
        "total_token_throughput": 300.0,
        "metadata": {"valid": True, "prefill_gpus": 1, "decode_gpus": 2},
    }
    assert {n: v.meets for n, v in judge(slos, fine).items()} == {"tight": True, "loose": True}
    assert goodput_per_device(fine) == 100.0
    slow = fine | {"p90_ttft_ms": 500.0}
    assert judge(slos, slow)["tight"].violations == ["ttft_p90 500.0 ms > 100 ms"] and judge(slos, slow)["loose"].meets
    invalid = fine | {"metadata": {"valid": False, "validity": {"reasons": ["decode computed the prompts"]}}}
    failed = fine | {"failed": 2}
    cut = fine | {"stop_reason": "total timeout: the sweep ran past total_timeout_s=5"}
    for point, word in ((invalid, "invalid: decode computed"), (failed, "2 request(s) failed"), (cut, "cut short")):
        verdicts = judge(slos, point)
        assert not any(v.meets for v in verdicts.values()) and verdicts["loose"].violations[0].startswith(word)
    assert judge(slos, fine | {"metadata": {"valid": None, "gpus": 4}})["tight"].meets  # unverified is not invalid
    assert goodput_per_device(fine | {"metadata": {"gpus": 4}}) == 75.0  # an aggregated point
    assert goodput_per_device(fine | {"metadata": {}}) is None  # devices unknown
    assert not judge(slos, None)["loose"].meets  # no result
