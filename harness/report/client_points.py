"""Load another client's points of a pdbench run (clients/<client>/conc_<C>/): its result as a
Point where it writes one pdbench can read (`vllm bench serve`), and how its run went."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.report.points import Note, Point, Run
from harness.report.result_file import NotAResult, read_point
from harness.rundir.paths import CLIENT_RUN, VLLM_BENCH_RESULT, RunDir

PHASES = {"disagg": "disagg", "aggregated": "agg"}  # run directory phase -> the report's serving kind


@dataclass(frozen=True)
class ClientPoint:
    run: str
    serving: str  # disagg | agg
    client: str
    concurrency: int
    point: Point | None  # None: the client wrote no result there that could be read
    # The client's CPU seconds per second (1.0: one core busy) over its measured window (the last
    # `duration` seconds of its run, past its start-up), else over its whole run.
    cpu_share: float | None
    returncode: int | None


def window_share(timeline: list[list[float]], duration: float | None) -> float | None:
    """CPU seconds per second over the timeline's last `duration` seconds ([t, cpu_s] pairs)."""
    if duration is None or duration <= 0 or len(timeline) < 2:
        return None
    (t_end, c_end), begin = timeline[-1], max(0.0, timeline[-1][0] - duration)
    before = [p for p in timeline if p[0] <= begin] or [timeline[0]]
    after = [p for p in timeline if p[0] >= begin]
    (t0, c0), (t1, c1) = before[-1], after[0]
    at_begin = c0 if t1 == t0 else c0 + (c1 - c0) * (begin - t0) / (t1 - t0)
    span = t_end - max(begin, timeline[0][0])
    return (c_end - at_begin) / span if span > 0 else None


def _cpu_share(record: Path, duration: float | None, notes: list[Note]) -> tuple[float | None, int | None]:
    if not record.is_file():
        return None, None
    try:
        data = json.loads(record.read_text())
        wall, cpu = float(data["wall_s"]), float(data["cpu_s"])
        rc = data["returncode"]
        share = window_share([[float(t), float(c)] for t, c in data.get("cpu_timeline") or []], duration)
    except (OSError, ValueError, KeyError, TypeError) as e:
        notes.append(Note(record, f"unreadable ({e}); the client's CPU share is not shown"))
        return None, None
    if share is None and wall > 0:
        share = cpu / wall
    return share, (rc if isinstance(rc, int) else None)


def _duration(result: Path) -> float | None:
    """The measured seconds `vllm bench serve` reports (its key `duration`)."""
    try:
        value = json.loads(result.read_text()).get("duration")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def vllm_points(run: Run, notes: list[Note]) -> list[ClientPoint]:
    """`vllm bench serve`'s points of one run, by serving kind and concurrency."""
    if not run.is_pdbench_run or not run.path.is_dir():
        return []
    rd = RunDir(run.path)
    out = []
    for phase, kind in PHASES.items():
        for conc, d in sorted(rd.client_points("vllm", phase).items()):
            result = d / VLLM_BENCH_RESULT
            share, rc = _cpu_share(d / CLIENT_RUN, _duration(result) if result.is_file() else None, notes)
            point = None
            if result.is_file():
                try:
                    point = read_point(result, run.path, notes)
                except NotAResult as e:
                    notes.append(Note(result, f"not used in the cross-check: {e}"))
            out.append(ClientPoint(run.label, kind, "vllm", conc, point, share, rc))
    return out
