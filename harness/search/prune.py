"""Whether a candidate is worth running, given the candidates already measured.

The assumption (every reason that uses a bound says it): a role's throughput at the SLO grows at
most in proportion to its compute units (Candidate.capacity: devices on GPU sites, bound cores on
CPU sites). A finished candidate M whose limit under an SLO is on side r (prefill or decode)
reached total token throughput T_M at its best point (the mean of its samples); a candidate C
with capacity C.capacity[r] on that side then reaches at most

    T_M × (C.capacity[r] / M.capacity[r]) × slack / C.devices   tok/s per device,

whatever its other role has, since r still limits it. `slack` (>= 1) allows for that assumption
being a little off. C is skipped only when, for every SLO, its tightest bound is below what a
finished disaggregated candidate surely reaches: the highest lower interval limit (mean -
half-width) among those meeting the SLO. A candidate measured once has an unknown half-width and
so bounds nothing from below. The aggregated baseline always runs: it is what the winner is
compared with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.search.outcome import CandidateOutcome
from harness.search.space import Candidate

ASSUMPTION = "assuming a role's throughput at the SLO grows at most in proportion to its compute units"


@dataclass(frozen=True)
class Decision:
    run: bool
    reason: str


@dataclass(frozen=True)
class _Bound:
    value: float  # tok/s per device
    by: str  # the candidate whose limit gives it
    side: str


@dataclass(frozen=True)
class _Incumbent:
    low: float
    name: str
    text: str  # "55.0 ± 1.1"


def _bound(
    candidate: Candidate, finished: Sequence[tuple[Candidate, CandidateOutcome]], slo: str, slack: float
) -> _Bound | None:
    """The tightest upper bound on the candidate's goodput per device under `slo`, if any."""
    bounds = []
    for m, out in finished:
        o = out.slos.get(slo)
        throughput = out.throughput(slo) if o else None
        if m.kind != "disagg" or o is None or throughput is None or o.limit.side not in ("prefill", "decode"):
            continue
        side = o.limit.side
        mine, theirs = candidate.capacity.get(side), m.capacity.get(side)
        if not mine or not theirs or candidate.devices <= 0:
            continue
        bounds.append(_Bound(throughput * (mine / theirs) * slack / candidate.devices, m.name, side))
    return min(bounds, key=lambda b: b.value) if bounds else None


def _incumbent(finished: Sequence[tuple[Candidate, CandidateOutcome]], slo: str) -> _Incumbent | None:
    """The finished disaggregated candidate meeting `slo` with the highest lower interval limit."""
    best: _Incumbent | None = None
    for m, out in finished:
        o = out.slos.get(slo)
        if m.kind != "disagg" or o is None or o.interval is None or not math.isfinite(o.interval.low):
            continue
        if best is None or o.interval.low > best.low:
            best = _Incumbent(o.interval.low, m.name, o.interval.text())
    return best


def next_decision(
    candidate: Candidate,
    finished: Sequence[tuple[Candidate, CandidateOutcome]],
    slos: Mapping[str, Mapping[str, float]],
    slack: float,
) -> Decision:
    """Run the candidate, or skip it because every SLO's bound on it is below what a finished
    candidate surely reaches; the reason carries the numbers either way."""
    if not slos:
        raise ValueError("no SLO to decide by")
    if slack < 1:
        raise ValueError(f"prune slack must be >= 1, got {slack!r}")
    if candidate.kind == "agg":
        return Decision(True, "ran: the aggregated baseline is never pruned")
    below = []
    for slo in slos:
        bound = _bound(candidate, finished, slo, slack)
        if bound is None:
            return Decision(True, f"ran: nothing measured bounds it yet ({slo})")
        incumbent = _incumbent(finished, slo)
        if incumbent is None:
            return Decision(
                True,
                f"ran: no finished candidate surely meets {slo} (none with a known interval), "
                f"so its bound {bound.value:.1f} tok/s/device rules nothing out",
            )
        if bound.value >= incumbent.low:
            return Decision(
                True,
                f"ran: bound {bound.value:.1f} >= {incumbent.low:.1f} ({slo}: {bound.side}-bound {bound.by} bounds "
                f"it at <= {bound.value:.1f} tok/s/device, {incumbent.name}'s {incumbent.text} reaches "
                f"at least {incumbent.low:.1f}; slack {slack:g}, {ASSUMPTION})",
            )
        below.append(
            f"{bound.side}-bound {bound.by} bounds it at <= {bound.value:.1f} tok/s/device ({slo}), "
            f"below {incumbent.name}'s {incumbent.text}"
        )
    return Decision(False, f"skipped: {'; '.join(below)} (slack {slack:g}, {ASSUMPTION})")
