"""A search's answer: the winner per SLO, the candidates tied with it, the aggregated baseline at
its device count, and what the search spent against what the full grid would have.

Winner: among the disaggregated candidates meeting the SLO at some concurrency, the highest mean
goodput per device at its best point. Ties: the other disaggregated candidates whose interval
overlaps the winner's (a candidate measured once has an unknown half-width and ties with all).
Baseline: the aggregated candidate with the winner's device count; ratio = winner's mean / its.

Device-hours spent: every job of the search, the baseline's and earlier failed attempts'
included, each devices × wall / 3600 (harness.search.outcome).

The full grid is what a user runs by hand without the search: every candidate of the grid
(every one the factors give but those the constraints exclude; pruned ones included), each
measured once at every ladder point, no repeats, plus the aggregated baseline(s). Its estimate
per candidate is devices × (mean start-up + ladder length × mean seconds per point), the means
taken over the jobs this search measured.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.interval import Interval
from harness.search.outcome import EXCLUDED, CandidateOutcome, ReportEntry


@dataclass(frozen=True)
class Pick:
    """A candidate's standing under one SLO: its best concurrency and interval there."""

    name: str
    devices: int
    concurrency: int
    interval: Interval

    def text(self) -> str:
        return f"{self.name} at c={self.concurrency}, {self.interval.text()} tok/s/device"

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": self.name,
            "devices": self.devices,
            "concurrency": self.concurrency,
            "interval": self.interval.to_json(),
        }


@dataclass(frozen=True)
class Choice:
    """One SLO's answer; `note` says why a part is missing (no winner, no baseline)."""

    slo: str
    winner: Pick | None
    ties: tuple[Pick, ...]
    baseline: Pick | None
    ratio: float | None  # winner / baseline goodput per device
    notes: tuple[str, ...]

    def text(self) -> str:
        if self.winner is None:
            return f"{self.slo}: no winner: {'; '.join(self.notes)}"
        head = f"{self.slo}: " + ("a tie: " if self.ties else "winner ") + self.winner.text()
        if self.ties:
            head += "; overlapping: " + ", ".join(t.text() for t in self.ties)
        if self.baseline is not None and self.ratio is not None:
            head += f"; aggregated baseline {self.baseline.text()}: ratio {self.ratio:.2f}x"
        return head + "".join(f"; {n}" for n in self.notes)

    def to_json(self) -> dict[str, Any]:
        return {
            "slo": self.slo,
            "winner": self.winner.to_json() if self.winner else None,
            "tie": bool(self.ties),
            "ties": [t.to_json() for t in self.ties],
            "baseline": self.baseline.to_json() if self.baseline else None,
            "ratio": self.ratio,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Spend:
    """Device-hours the search spent, and the full grid's estimate (None when nothing was measured)."""

    device_hours: float
    jobs: int
    cost_unknown: tuple[str, ...]  # candidates with a job whose cost is not recorded
    grid_device_hours: float | None
    grid_jobs: int
    mean_startup_s: float | None
    mean_per_point_s: float | None
    ladder_length: int

    def text(self) -> str:
        spent = f"{self.device_hours:.3f} device-hours over {self.jobs} job{'' if self.jobs == 1 else 's'}"
        if self.cost_unknown:
            spent += f" (cost not recorded: {', '.join(self.cost_unknown)})"
        if self.grid_device_hours is None:
            return spent + "; the full grid's estimate needs a measured job"
        assert self.mean_startup_s is not None and self.mean_per_point_s is not None
        return (
            f"{spent}; the full grid by hand ({self.grid_jobs} jobs × {self.ladder_length} points, no repeats): "
            f"about {self.grid_device_hours:.3f} device-hours (start-up {self.mean_startup_s:.0f} s, "
            f"{self.mean_per_point_s:.1f} s per point, measured means)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "device_hours": self.device_hours,
            "jobs": self.jobs,
            "cost_unknown": list(self.cost_unknown),
            "grid_device_hours": self.grid_device_hours,
            "grid_jobs": self.grid_jobs,
            "mean_startup_s": self.mean_startup_s,
            "mean_per_point_s": self.mean_per_point_s,
            "ladder_length": self.ladder_length,
        }


def _picks(entries: Sequence[ReportEntry], slo: str, kind: str) -> list[Pick]:
    out = []
    for e in entries:
        o = e.outcome.slos.get(slo) if e.outcome else None
        if e.candidate.kind == kind and o is not None and o.best is not None and o.interval is not None:
            out.append(Pick(e.candidate.name, e.candidate.devices, o.best, o.interval))
    return sorted(out, key=lambda p: -p.interval.mean)


def choose(entries: Sequence[ReportEntry], slo: str) -> Choice:
    """The winner under `slo`, its ties and its baseline."""
    picks = _picks(entries, slo, "disagg")
    if not picks:
        return Choice(slo, None, (), None, None, ("no disaggregated candidate meets it at any measured concurrency",))
    winner = picks[0]
    ties = tuple(p for p in picks[1:] if p.interval.overlaps(winner.interval))
    notes: list[str] = []
    if ties and winner.interval.n == 1:
        notes.append(
            f"{winner.name} was measured once: its interval is unknown, so it ties with every candidate meeting the SLO"
        )
    aggs = [e for e in entries if e.candidate.kind == "agg"]
    at_count = [p for p in _picks(entries, slo, "agg") if p.devices == winner.devices]
    baseline = at_count[0] if at_count else None
    ratio = winner.interval.mean / baseline.interval.mean if baseline and baseline.interval.mean > 0 else None
    if baseline is None:
        same = [e.candidate.name for e in aggs if e.candidate.devices == winner.devices]
        if same:
            notes.append(f"the aggregated baseline {', '.join(same)} meets it at no measured concurrency")
        elif aggs:
            counts = ", ".join(f"{e.candidate.name} ({e.candidate.devices})" for e in aggs)
            notes.append(f"no aggregated baseline with {winner.devices} devices (ran: {counts})")
        else:
            notes.append("no aggregated baseline in this search")
    return Choice(slo, winner, ties, baseline, ratio, tuple(notes))


def choose_all(entries: Sequence[ReportEntry], slos: Mapping[str, Mapping[str, float]]) -> dict[str, Choice]:
    return {slo: choose(entries, slo) for slo in slos}


def _jobs(entries: Sequence[ReportEntry]) -> Iterator[tuple[str, CandidateOutcome]]:
    for e in entries:
        for out in (*e.earlier, *([e.outcome] if e.outcome else [])):
            yield e.candidate.name, out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def spend(entries: Sequence[ReportEntry], ladder: Sequence[int]) -> Spend:
    """Device-hours spent by every job of the search, and the full grid's estimate."""
    jobs = list(_jobs(entries))
    hours = [o.cost.device_hours for _, o in jobs if o.cost.device_hours is not None]
    unknown = tuple(dict.fromkeys(name for name, o in jobs if o.cost.device_hours is None))
    startup = _mean([o.cost.startup_s for _, o in jobs if o.cost.startup_s is not None])
    per_point = _mean([o.cost.per_point_s for _, o in jobs if o.cost.per_point_s is not None])
    grid = [e.candidate for e in entries if e.status != EXCLUDED]
    estimate = None
    if startup is not None and per_point is not None:
        estimate = sum(c.devices * (startup + len(ladder) * per_point) for c in grid) / 3600
    return Spend(sum(hours), len(jobs), unknown, estimate, len(grid), startup, per_point, len(ladder))
