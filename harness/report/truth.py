"""Disaggregate or not? The truth table of one model on one GPU count: per ISL/OSL and
concurrency, the disaggregated points against the aggregated baseline on the same number of GPUs
(N replicas, or one instance over them all), goodput per GPU under the SLO, who wins, and where
disaggregation starts to win (the crossover).

Like with like only: a cell pairs points of the same model, GPU count, deployment (1P1D over one
connector, N replicas: harness.report.deployment), ISL, OSL and concurrency.
The same cell in several runs given to the report is a repeat: its samples give a Student's t
interval (harness.interval). A sample is the point's total tok/s per GPU when it meets the SLO,
0 when it misses (a failed or cut-short point misses too); an invalid point is no measurement
and is left out. Without an SLO every valid point counts with its throughput.

Who wins a cell: where both sides have repeats, the side whose interval lies above the other's
(overlapping intervals: a tie); otherwise the higher value. Neither wins when no point of either
meets the SLO; a side with no usable point is missing, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from harness.config.slo import violations
from harness.interval import Interval, t_interval
from harness.report.deployment import deployment
from harness.report.point_slo import failures
from harness.report.points import Point, Run, serving

KINDS = ("disagg", "agg")
Winner = Literal["disagg", "agg", "tie", "neither", "missing"]


@dataclass(frozen=True)
class Side:
    """One serving kind's points of a cell, over every run that measured it."""

    runs: tuple[str, ...]
    samples: tuple[float, ...]  # goodput per GPU of each valid point: its tok/s/GPU, or 0 if it missed
    met: int  # of the samples, those whose point met the SLO
    invalid: int  # points left out as invalid
    misses: tuple[str, ...]  # what points missed (a bound's key, failed requests, cut short), each once
    verdicts: tuple[str, ...]  # the points' bottleneck verdicts, each once

    @property
    def interval(self) -> Interval | None:
        return t_interval(self.samples) if self.samples else None


@dataclass(frozen=True)
class Cell:
    isl: int | None
    osl: int | None
    conc: int
    sides: dict[str, Side]  # a kind with no point at all is absent
    winner: Winner
    crossover: bool = False  # disagg wins here and did not at the shape's previous compared concurrency

    @property
    def ratio(self) -> float | None:
        """Disagg's mean goodput over the baseline's; None where either is missing or the baseline's is 0."""
        d, a = (self.sides.get(k) for k in KINDS)
        di, ai = (d.interval if d else None), (a.interval if a else None)
        return di.mean / ai.mean if di and ai and ai.mean > 0 else None


@dataclass(frozen=True)
class TruthTable:
    model: str | None
    gpus: int
    disagg: str  # the disaggregated deployment (harness.report.deployment)
    agg: str | None  # the baseline's; None: no aggregated point on these GPUs
    cells: tuple[Cell, ...]  # by ISL, OSL, concurrency
    # Aggregated points of this model on another GPU count with no disaggregated points of their own
    # there: (GPUs, runs). Not compared (the GPU count differs); named so that a reader knows.
    other_gpus: tuple[tuple[int, tuple[str, ...]], ...] = ()


def gpus_of(p: Point) -> int | None:
    """A point's GPUs: prefill + decode (an aggregated point's are all counted as prefill)."""
    if p.prefill_gpus is None or p.decode_gpus is None or p.prefill_gpus + p.decode_gpus <= 0:
        return None
    return p.prefill_gpus + p.decode_gpus


def _missed(p: Point, bounds: Mapping[str, float]) -> list[str]:
    """What a point missed, short: the bounds' keys, failed requests, cut short (the section
    "Under the SLO" gives each value against its bound)."""
    out = [k for k, b in bounds.items() if violations({k: b}, p.ms)]
    return out + (["failed requests"] if p.failed else []) + (["cut short"] if p.stop_reason else [])


def _side(found: list[tuple[Run, Point]], bounds: Mapping[str, float]) -> Side:
    samples, met, invalid, misses, verdicts = [], 0, 0, [], []
    for _, p in found:
        if p.bottleneck is not None and p.bottleneck.verdict not in verdicts:
            verdicts.append(p.bottleneck.verdict)
        if p.verdict == "invalid":
            invalid += 1
            continue
        gpus = gpus_of(p)
        assert gpus is not None  # grouped by it
        missed = bool(failures(p, bounds))
        samples.append(0.0 if missed else p.total_token_throughput / gpus)
        met += not missed
        misses += [w for w in _missed(p, bounds) if w not in misses]
    runs = tuple(dict.fromkeys(run.label for run, _ in found))
    return Side(runs, tuple(samples), met, invalid, tuple(misses), tuple(verdicts))


def winner(sides: Mapping[str, Side]) -> Winner:
    d, a = sides.get("disagg"), sides.get("agg")
    di, ai = (d.interval if d else None), (a.interval if a else None)
    if di is None or ai is None:
        return "missing"
    if di.mean == 0 and ai.mean == 0:
        return "neither"
    both_repeated = math.isfinite(di.half_width) and math.isfinite(ai.half_width)
    if (both_repeated and di.overlaps(ai)) or di.mean == ai.mean:
        return "tie"
    return "disagg" if di.mean > ai.mean else "agg"


def _marked(cells: list[Cell]) -> list[Cell]:
    """The cells of one shape in concurrency order, each crossover marked: disagg wins where, at
    the previous concurrency compared, it did not."""
    out, before = [], None
    for c in cells:
        cross = c.winner == "disagg" and before is not None and before != "disagg"
        out.append(Cell(c.isl, c.osl, c.conc, c.sides, c.winner, cross))
        if c.winner != "missing":
            before = c.winner
    return out


def _sort_key(v: int | None) -> int:
    return -1 if v is None else v


Found = list[tuple[Run, Point]]


def _cells(points: Found, bounds: Mapping[str, float]) -> tuple[Cell, ...]:
    """The points of one pair of deployments as cells, by ISL, OSL and concurrency."""
    at: dict[tuple[int | None, int | None, int], dict[str, Found]] = {}
    for run, p in points:
        at.setdefault((p.isl, p.osl, p.concurrency), {}).setdefault(serving(p), []).append((run, p))
    cells: list[Cell] = []
    for isl, osl in sorted({(i, o) for i, o, _ in at}, key=lambda s: (_sort_key(s[0]), _sort_key(s[1]))):
        shape = []
        for conc in sorted(c for i, o, c in at if (i, o) == (isl, osl)):
            sides = {k: _side(pts, bounds) for k, pts in at[(isl, osl, conc)].items()}
            shape.append(Cell(isl, osl, conc, sides, winner(sides)))
        cells += _marked(shape)
    return tuple(cells)


def truth_tables(runs: Iterable[Run], bounds: Mapping[str, float] | None = None) -> list[TruthTable]:
    """Per model and GPU count that has disaggregated points, one table per disaggregated
    deployment and baseline deployment on those GPUs (one with no baseline when there is none),
    when the runs hold both kinds of point (else none: nothing to compare). Points whose GPU
    count is unknown are left out."""
    groups: dict[tuple[str | None, int], Found] = {}
    for run in runs:
        for p in run.points:
            if (gpus := gpus_of(p)) is not None:
                groups.setdefault((p.model, gpus), []).append((run, p))
    if {serving(p) for found in groups.values() for _, p in found} != set(KINDS):
        return []
    with_disagg = {key for key, found in groups.items() if any(serving(p) == "disagg" for _, p in found)}
    tables = []
    for model, gpus in sorted(with_disagg, key=lambda k: (str(k[0]), k[1])):
        found = groups[(model, gpus)]
        kinds = {k: sorted({deployment(p) for _, p in found if serving(p) == k}) for k in KINDS}
        other = tuple(
            (g, tuple(dict.fromkeys(run.label for run, _ in groups[(m, g)])))
            for m, g in sorted(groups, key=lambda k: (str(k[0]), k[1]))
            if m == model and g != gpus and (m, g) not in with_disagg
        )
        baselines: list[str | None] = [*kinds["agg"]] or [None]
        for d in kinds["disagg"]:
            for a in baselines:
                pair = [(run, p) for run, p in found if (serving(p), deployment(p)) in {("disagg", d), ("agg", a)}]
                tables.append(TruthTable(model, gpus, d, a, _cells(pair, bounds or {}), other))
    return tables
