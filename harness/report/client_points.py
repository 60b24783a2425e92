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
    cpu_share: float | None  # the client's CPU seconds over its wall seconds (1.0: one core busy)
    returncode: int | None


def _cpu_share(record: Path, notes: list[Note]) -> tuple[float | None, int | None]:
    if not record.is_file():
        return None, None
    try:
        data = json.loads(record.read_text())
        wall, cpu = float(data["wall_s"]), float(data["cpu_s"])
        rc = data["returncode"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        notes.append(Note(record, f"unreadable ({e}); the client's CPU share is not shown"))
        return None, None
    return (cpu / wall if wall > 0 else None), (rc if isinstance(rc, int) else None)


def vllm_points(run: Run, notes: list[Note]) -> list[ClientPoint]:
    """`vllm bench serve`'s points of one run, by serving kind and concurrency."""
    if not run.is_pdbench_run or not run.path.is_dir():
        return []
    rd = RunDir(run.path)
    out = []
    for phase, kind in PHASES.items():
        for conc, d in sorted(rd.client_points("vllm", phase).items()):
            share, rc = _cpu_share(d / CLIENT_RUN, notes)
            point = None
            result = d / VLLM_BENCH_RESULT
            if result.is_file():
                try:
                    point = read_point(result, run.path, notes)
                except NotAResult as e:
                    notes.append(Note(result, f"not used in the cross-check: {e}"))
            out.append(ClientPoint(run.label, kind, "vllm", conc, point, share, rc))
    return out
