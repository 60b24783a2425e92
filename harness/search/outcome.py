"""A candidate's outcome, read back from its run directory: what it reached under each SLO and
what it cost.

The run's points are its result files (the top level: the first measurement of each ladder
point; repeats/<k>/: repeat k of a best point), read with the report's reader so the file
format has one reader, and judged again here for the search's SLOs with harness.config.slo:
a point meets an SLO when no bound is violated, its verdict is not invalid, no request failed
and it was not cut short (stop_reason). The run's own slo_search.json is read for what the job decided (its best per SLO and
whether its search ended); where the two disagree the outcome says so in its notes.

Per SLO: the best concurrency is the highest one at and below which every measured point meets
the SLO (the ladder search's answer when the points agree; a point above a failure that meets by
chance does not count), judged on the first measurements. Its goodput-per-device samples are the first measurement and
every repeat at that concurrency. The limit side is read at the lowest failing concurrency
above the best: the metrics it broke, prefill (ttft only), decode (tpot, itl only) or unknown
(both, e2el, a failed, invalid or cut-short point, or no failure seen on the ladder).

Goodput per device = a point's total_token_throughput / its devices (metadata prefill_gpus +
decode_gpus; an aggregated point's gpus): the one definition of issue 33.

Cost: from the job's start on its nodes to status.json's finished_at (else, for a job killed
before writing it, the newest file of the run directory): wall seconds, and device-hours =
devices × wall / 3600. The job's start is the earliest of its nodes' rendezvous records
(nodes/<n>.json, written by each node as it starts), else the launch record's time: a Slurm job
holds no devices while it waits in the queue, so that wait does not count. Start-up = the job's
start to the first point's start (result files record it); seconds per point = from the first
point's start to the end, over the points measured (repeats included).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.config.slo import DECODE_SIDE, PREFILL_SIDE, violated_metrics
from harness.interval import Interval, t_interval
from harness.launch.job import LaunchError
from harness.launch.record import read_record
from harness.report.point_slo import failures as _failures
from harness.report.points import Note, Point, serving
from harness.report.result_file import NotAResult, read_point
from harness.rundir import RunDir, read_status
from harness.rundir.paths import REPEATS
from harness.rundir.result_name import ResultName
from harness.search.space import Candidate

Side = Literal["prefill", "decode", "unknown"]


@dataclass(frozen=True)
class Limit:
    """What stopped a candidate going higher under one SLO, with the numbers that show it."""

    side: Side
    concurrency: int | None  # the failing point read; None when none failed above the best
    metrics: tuple[str, ...]  # the metrics it broke (ttft, tpot, ...)
    evidence: tuple[str, ...]  # the violations in words ("tpot_p90 45.2 ms > 40 ms", "2 failed requests")

    def text(self) -> str:
        if self.concurrency is None:
            return f"{self.side} ({'; '.join(self.evidence)})"
        return f"{self.side} at c={self.concurrency}: {'; '.join(self.evidence)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "concurrency": self.concurrency,
            "metrics": list(self.metrics),
            "evidence": list(self.evidence),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Limit:
        return cls(data["side"], data["concurrency"], tuple(data["metrics"]), tuple(data["evidence"]))


@dataclass(frozen=True)
class SLOOutcome:
    """One SLO: the best concurrency, its goodput-per-device samples and interval, the limit."""

    best: int | None  # None: no measured concurrency meets the SLO
    samples: tuple[float, ...]  # goodput per device at best: the first measurement, then the repeats
    interval: Interval | None  # None when there is no best
    limit: Limit
    recorded_best: int | None  # what the run's slo_search.json says (None when absent)

    def to_json(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "samples": list(self.samples),
            "interval": self.interval.to_json() if self.interval else None,
            "limit": self.limit.to_json(),
            "recorded_best": self.recorded_best,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SLOOutcome:
        interval = data.get("interval")
        return cls(
            data["best"],
            tuple(float(s) for s in data["samples"]),
            Interval.from_json(interval) if interval else None,
            Limit.from_json(data["limit"]),
            data.get("recorded_best"),
        )


@dataclass(frozen=True)
class PlotPoint:
    """One measured point as the Pareto plot draws it."""

    file: str  # relative to the run directory
    concurrency: int
    repeat: int  # 0: the first measurement
    goodput_per_device: float
    interactivity: float | None  # tok/s/user = 1000 / median_tpot_ms
    ttft_p90_ms: float | None
    meets: Mapping[str, bool]  # per SLO

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "concurrency": self.concurrency,
            "repeat": self.repeat,
            "goodput_per_device": self.goodput_per_device,
            "interactivity": self.interactivity,
            "ttft_p90_ms": self.ttft_p90_ms,
            "meets": dict(self.meets),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlotPoint:
        return cls(
            data["file"],
            data["concurrency"],
            data["repeat"],
            data["goodput_per_device"],
            data["interactivity"],
            data["ttft_p90_ms"],
            dict(data["meets"]),
        )


@dataclass(frozen=True)
class Cost:
    """What the candidate's job took; None where the run directory does not record it."""

    wall_s: float | None  # launch record's time to the end
    device_hours: float | None  # devices × wall / 3600
    startup_s: float | None  # launch to the first point's start
    per_point_s: float | None  # first point's start to the end, over the points measured
    points: int  # points measured, repeats included

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "device_hours": self.device_hours,
            "startup_s": self.startup_s,
            "per_point_s": self.per_point_s,
            "points": self.points,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cost:
        return cls(data["wall_s"], data["device_hours"], data["startup_s"], data["per_point_s"], data["points"])


@dataclass(frozen=True)
class CandidateOutcome:
    candidate: str
    devices: int
    state: str | None  # status.json's state (succeeded, failed, timeout); None: no status yet
    reason: str | None  # the job's failure, when it failed
    done: bool  # the job's SLO search ended normally (slo_search.json's done)
    slos: Mapping[str, SLOOutcome]
    points: tuple[PlotPoint, ...]
    cost: Cost
    notes: tuple[str, ...] = field(default=())

    def throughput(self, slo: str) -> float | None:
        """Total token throughput at the SLO's best point (mean): goodput per device × devices."""
        interval = self.slos[slo].interval
        return None if interval is None else interval.mean * self.devices

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "devices": self.devices,
            "state": self.state,
            "reason": self.reason,
            "done": self.done,
            "slos": {name: o.to_json() for name, o in self.slos.items()},
            "points": [p.to_json() for p in self.points],
            "cost": self.cost.to_json(),
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateOutcome:
        return cls(
            data["candidate"],
            data["devices"],
            data["state"],
            data["reason"],
            data["done"],
            {name: SLOOutcome.from_json(o) for name, o in data["slos"].items()},
            tuple(PlotPoint.from_json(p) for p in data["points"]),
            Cost.from_json(data["cost"]),
            tuple(data["notes"]),
        )


@dataclass(frozen=True)
class ReportEntry:
    """A candidate's line in the search: what was decided for it and, once it ran, its outcome."""

    candidate: Candidate
    status: str  # harness.search.driver's word for it (finished, failed, skipped, excluded, ...)
    reason: str
    run: Path | None
    outcome: CandidateOutcome | None
    earlier: tuple[CandidateOutcome, ...] = ()  # earlier attempts' jobs (failed, cancelled): they spent too
    forecast: Mapping[str, Any] | None = None  # harness.search.foresee.Forecast's JSON, made before it ran
    pruned_by: str | None = None  # the rule that skipped it (throughput-bound, prediction, budget)


# The status of a candidate left out of the search by its constraints: not part of the grid.
EXCLUDED = "excluded"


@dataclass(frozen=True)
class _Measured:
    point: Point
    file: str
    repeat: int
    goodput_per_device: float


def _devices(point: Point) -> int | None:
    """The point's devices: its metadata's (else its file name's) prefill + decode; None if unknown."""
    n = (point.prefill_gpus or 0) + (point.decode_gpus or 0)
    return n or None


def _files(run: RunDir) -> list[tuple[Path, int]]:
    """(result file, repeat) of the top level (repeat 0) and of repeats/<k>/."""
    out = [(p, 0) for p in run.results()]
    repeats = run.path / REPEATS
    if repeats.is_dir():
        for d in sorted((d for d in repeats.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name)):
            out += [(p, int(d.name)) for p in sorted(d.glob(ResultName.GLOB))]
    return out


def _read_points(run: RunDir, candidate: Candidate, notes: list[str]) -> list[_Measured]:
    kind = "agg" if candidate.kind == "agg" else "disagg"
    found: list[_Measured] = []
    read_notes: list[Note] = []
    for path, repeat in _files(run):
        file = run.relative(path)
        try:
            point = read_point(path, run.path, read_notes)
        except NotAResult as e:
            notes.append(f"{file}: not used: {e}")
            continue
        if serving(point) != kind:
            continue  # another phase of the job (an aggregated baseline beside a disaggregated sweep)
        devices = _devices(point)
        if devices is None:
            devices = candidate.devices
            notes.append(f"{file}: records no devices; the candidate's {devices} used")
        found.append(_Measured(point, file, repeat, point.total_token_throughput / devices))
    notes += [f"{run.relative(n.path)}: {n.text}" for n in read_notes]
    return found


def _read_json(path: Path, notes: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        notes.append(f"{path.name}: unreadable ({e}); not used")
        return None
    if not isinstance(data, dict):
        notes.append(f"{path.name}: not a JSON object; not used")
        return None
    return data


def _limit(first: Mapping[int, _Measured], best: int | None, bounds: Mapping[str, float]) -> Limit:
    above = [c for c in sorted(first) if (best is None or c > best) and _failures(first[c].point, bounds)]
    if not above:
        top = max(first) if first else None
        why = "no point measured" if top is None else f"c={top}, the highest measured, meets: no limit seen"
        return Limit("unknown", None, (), (why,))
    c = above[0]
    point = first[c].point
    metrics = violated_metrics(bounds, point.ms)
    side: Side = "unknown"
    if metrics and metrics <= PREFILL_SIDE:
        side = "prefill"
    elif metrics and metrics <= DECODE_SIDE:
        side = "decode"
    if point.verdict == "invalid" or point.failed or point.stop_reason:
        side = "unknown"  # a broken point says nothing about which role ran out
    return Limit(side, c, tuple(sorted(metrics)), tuple(_failures(point, bounds)))


def _judge(
    name: str,
    bounds: Mapping[str, float],
    measured: Sequence[_Measured],
    recorded: Mapping[str, Any],
    confidence: float,
    notes: list[str],
) -> SLOOutcome:
    first = {m.point.concurrency: m for m in measured if m.repeat == 0}
    failing = [c for c in sorted(first) if _failures(first[c].point, bounds)]
    lowest_failing = failing[0] if failing else math.inf
    meeting = [c for c in first if c < lowest_failing and not _failures(first[c].point, bounds)]
    best = max(meeting) if meeting else None
    rb = recorded.get(name)
    recorded_best = rb if isinstance(rb, int) and not isinstance(rb, bool) else None
    if name in recorded and recorded_best != best:
        notes.append(f"{name}: the job's slo_search.json says best c={rb}, judged again here: c={best}")
    samples: list[float] = []
    if best is not None:
        at_best = sorted((m for m in measured if m.point.concurrency == best), key=lambda m: m.repeat)
        samples = [m.goodput_per_device for m in at_best]
        notes += [
            f"{name}: repeat {m.repeat} at c={best} does not meet it ({'; '.join(_failures(m.point, bounds))}); "
            "its goodput is a sample all the same"
            for m in at_best
            if m.repeat and _failures(m.point, bounds)
        ]
    return SLOOutcome(
        best,
        tuple(samples),
        t_interval(samples, confidence) if samples else None,
        _limit(first, best, bounds),
        recorded_best,
    )


def _newest_mtime(run: RunDir) -> float | None:
    times = [p.stat().st_mtime for p in run.path.rglob("*") if p.is_file()]
    return max(times) if times else None


def _job_start(run: RunDir, notes: list[str]) -> float | None:
    """When the job started on its nodes: the first rendezvous record, else the launch record."""
    rendezvous = [p.stat().st_mtime for p in run.nodes.glob("*.json")] if run.nodes.is_dir() else []
    if rendezvous:
        return min(rendezvous)
    try:
        record = read_record(run)
    except LaunchError as e:
        notes.append(f"{e}; its cost is unknown")
        return None
    return record.time if record else None


def _cost(
    run: RunDir, candidate: Candidate, status: Mapping[str, Any] | None, measured: Sequence[_Measured], notes: list[str]
) -> Cost:
    began = _job_start(run, notes)
    ended = status.get("finished_at") if status else None
    if not isinstance(ended, int | float) or isinstance(ended, bool):
        ended = _newest_mtime(run) if began is not None else None
        if ended is not None:
            notes.append("no finished_at in status.json: the job's end is taken as its newest file's time")
    starts = [m.point.started for m in measured if m.point.started is not None]
    first_start = min(starts) if starts else None
    wall = ended - began if began is not None and ended is not None else None
    startup = first_start - began if began is not None and first_start is not None else None
    per_point = (ended - first_start) / len(measured) if ended is not None and first_start is not None else None
    return Cost(
        wall,
        None if wall is None else candidate.devices * wall / 3600,
        startup,
        per_point,
        len(measured),
    )


def _plot_point(m: _Measured, slos: Mapping[str, Mapping[str, float]]) -> PlotPoint:
    tpot = m.point.ms.get("median_tpot_ms")
    return PlotPoint(
        m.file,
        m.point.concurrency,
        m.repeat,
        m.goodput_per_device,
        1000 / tpot if tpot else None,
        m.point.ms.get("p90_ttft_ms"),
        {name: not _failures(m.point, bounds) for name, bounds in slos.items()},
    )


def read_outcome(
    run_path: Path, candidate: Candidate, slos: Mapping[str, Mapping[str, float]], *, confidence: float = 0.95
) -> CandidateOutcome:
    """The candidate's outcome from its run directory, judged for `slos` (name -> bounds, as
    harness.config.slo.check_bounds gives them); intervals at `confidence`."""
    run = RunDir(Path(run_path))
    notes: list[str] = []
    try:
        status = read_status(run)
    except (OSError, ValueError) as e:
        notes.append(f"{run.status.name}: unreadable ({e}); the job's state is unknown")
        status = None
    record = _read_json(run.slo_search, notes) or {}
    best = record.get("best")
    recorded: Mapping[str, Any] = best if isinstance(best, dict) else {}
    judged = record.get("slos")
    if isinstance(judged, dict) and {k: dict(v) for k, v in judged.items() if isinstance(v, dict)} != {
        k: dict(v) for k, v in slos.items()
    }:
        notes.append(f"the job searched for other SLOs ({json.dumps(judged)}); its points are judged for the search's")
        recorded = {}
    measured = _read_points(run, candidate, notes)
    return CandidateOutcome(
        candidate=candidate.name,
        devices=candidate.devices,
        state=status.get("state") if status else None,
        reason=status.get("reason") if status else None,
        done=record.get("done") is True,
        slos={name: _judge(name, bounds, measured, recorded, confidence, notes) for name, bounds in slos.items()},
        points=tuple(_plot_point(m, slos) for m in measured),
        cost=_cost(run, candidate, status, measured, notes),
        notes=tuple(notes),
    )
