"""The SLO search over a concurrency ladder, as pure decisions (no I/O): which point to measure
next and why, each SLO's best and first failing concurrency, and when repeats of a point stop.

Per SLO in order, reusing every point already measured (a point is judged for every SLO at
once): measure the start; while it meets the SLO, go up to the smallest ladder value at least
twice the last meeting one (the ladder's top if none; the search of that SLO ends when the top
meets); at the first failure stop going up, and bisect the ladder's indices between the highest
meeting and the lowest failing point until they are adjacent. A start that fails is bisected
down the same way. Best: the highest meeting value so found (None when none meets).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from harness.interval import t_interval

Why = Literal["start", "up", "bisect"]


@dataclass(frozen=True)
class Step:
    concurrency: int
    why: Why


@dataclass(frozen=True)
class Bracket:
    """One SLO's outcome: the highest meeting and the lowest failing ladder value (None: none)."""

    best: int | None
    first_failing: int | None


class Ladder:
    """The search's state: the points measured so far and their verdicts per SLO."""

    def __init__(self, ladder: Sequence[int], slos: Sequence[str], start: int) -> None:
        if list(ladder) != sorted(set(ladder)) or not ladder:
            raise ValueError(f"a ladder ascends without repeats, got {list(ladder)}")
        if start not in ladder:
            raise ValueError(f"start {start} is not on the ladder {list(ladder)}")
        self.ladder, self.slos, self.start = list(ladder), list(slos), start
        self.meets: dict[int, dict[str, bool]] = {}  # concurrency -> SLO -> meets

    def record(self, concurrency: int, meets: Mapping[str, bool]) -> None:
        """A measured point's verdict for every SLO (a point never measured again here)."""
        if concurrency not in self.ladder:
            raise ValueError(f"{concurrency} is not on the ladder {self.ladder}")
        self.meets[concurrency] = {s: bool(meets[s]) for s in self.slos}

    def next(self) -> Step | None:
        """The next point to measure; None once every SLO's search has ended."""
        for slo in self.slos:
            step, _ = self._walk(slo)
            if step is not None:
                return step
        return None

    def bracket(self, slo: str) -> Bracket:
        """The SLO's best and first failing value from the points measured so far (final once
        next() is None)."""
        return self._walk(slo)[1]

    def _walk(self, slo: str) -> tuple[Step | None, Bracket]:
        ladder, meets = self.ladder, self.meets
        ok = lambda i: meets[ladder[i]][slo]  # noqa: E731
        i = ladder.index(self.start)
        if ladder[i] not in meets:
            return Step(ladder[i], "start"), Bracket(None, None)
        lo, hi = -1, i  # the highest meeting and the lowest failing index found (-1: none meets)
        if ok(i):
            while True:
                lo = i
                if i == len(ladder) - 1:
                    return None, Bracket(ladder[i], None)
                # The smallest value at least twice the last meeting one; the top when none is.
                i = next((j for j in range(i + 1, len(ladder)) if ladder[j] >= 2 * ladder[lo]), len(ladder) - 1)
                if ladder[i] not in meets:
                    return Step(ladder[i], "up"), Bracket(ladder[lo], None)
                if not ok(i):
                    hi = i
                    break
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ladder[mid] not in meets:
                return Step(ladder[mid], "bisect"), Bracket(ladder[lo] if lo >= 0 else None, ladder[hi])
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return None, Bracket(ladder[lo] if lo >= 0 else None, ladder[hi])


def repeats_stop(
    samples: Sequence[float], repeats: int, max_repeats: int, ci_half_width: float, confidence: float
) -> str | None:
    """Why a point's repeats stop ("tight": the interval is narrow enough; "max": max_repeats
    repeats were made), or None to measure it again. `samples`: every measurement of the point
    that gave one, the first included; `repeats`: the repeats made so far."""
    if samples and t_interval(samples, confidence).relative <= ci_half_width:
        return "tight"
    if repeats >= max_repeats:
        return "max"
    return None
