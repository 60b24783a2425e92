"""Router arms side by side (proxy.arms): per shape and concurrency, each arm's figures over the
same servers, prompts and seeds, measured one after the other in one job.

A run's arms are its own points (the job's router, metadata.arm) and arms/<arm>/'s. The same
cell (shape, concurrency, arm) in several runs given to the report is a repeat, as in the truth
table: its samples give a Student's t interval (harness.interval); one run gives `± ?`. An
invalid point is no measurement and is left out, counted in the Invalid column.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from harness.interval import t_interval
from harness.report.explain import WITHOUT_PDBENCH_PROXY
from harness.report.model import SectionTable
from harness.report.points import Note, Point, Run
from harness.report.result_file import NotAResult, read_point
from harness.rundir.paths import ARMS
from harness.rundir.result_name import ResultName

HEADERS = (
    "Arm",
    "ISL",
    "OSL",
    "Conc",
    "Runs",
    "Invalid",
    "Output tok/s",
    "TTFT p50 (ms)",
    "TPOT p50 (ms)",
    "E2EL p50 (ms)",
)
FIGURES: tuple[tuple[str, Callable[[Point], float]], ...] = (
    ("Output tok/s", lambda p: p.output_throughput),
    ("TTFT p50 (ms)", lambda p: p.ms.get("median_ttft_ms", math.nan)),
    ("TPOT p50 (ms)", lambda p: p.ms.get("median_tpot_ms", math.nan)),
    ("E2EL p50 (ms)", lambda p: p.ms.get("median_e2el_ms", math.nan)),
)


def arm_of(p: Point) -> str | None:
    arm = p.metadata.get("arm")
    return str(arm) if arm else None


def arm_points(run: Run, notes: list[Note]) -> list[Point]:
    """A run's points of every router arm: its own (with metadata.arm) and those under arms/<arm>/."""
    own = [p for p in run.points if arm_of(p) is not None]
    root = run.path / ARMS
    if not run.path.is_dir() or not root.is_dir():
        return own
    later: list[Point] = []
    for f in sorted(root.glob(f"*/{ResultName.GLOB}")):
        try:
            later.append(read_point(f, run.path, notes))
        except NotAResult as e:
            notes.append(Note(f, f"router arm result not used: {e}"))
    return own + [p for p in later if arm_of(p) is not None]


def _cell(samples: list[float]) -> str:
    values = [v for v in samples if math.isfinite(v)]
    if not values:
        return "–"
    digits = 1 if abs(sum(values) / len(values)) >= 10 else 2
    return t_interval(values).text(digits)


def arms_table(runs: list[Run], notes: list[Note]) -> SectionTable | None:
    """The arms side by side per shape and concurrency; None when no run measured two arms."""
    points = [(run, p) for run in runs for p in arm_points(run, notes)]
    if len({arm_of(p) for _, p in points}) < 2:
        return None
    order: dict[str, int] = {}
    for _, p in points:
        order.setdefault(arm_of(p) or "", len(order))
    cells: dict[tuple[int, int, int, int], list[Point]] = {}
    invalid: dict[tuple[int, int, int, int], int] = {}
    for _, p in points:
        key = (p.isl or -1, p.osl or -1, p.concurrency, order[arm_of(p) or ""])
        cells.setdefault(key, [])
        if p.valid is False:
            invalid[key] = invalid.get(key, 0) + 1
        else:
            cells[key].append(p)
    names = {i: a for a, i in order.items()}
    rows = []
    for key in sorted(cells):
        isl, osl, conc, arm = key
        ps = cells[key]
        rows.append(
            (
                names[arm],
                "–" if isl < 0 else str(isl),
                "–" if osl < 0 else str(osl),
                str(conc),
                str(len(ps)),
                str(invalid.get(key, 0)),
                *(_cell([f(p) for p in ps]) for _, f in FIGURES),
            )
        )
    return SectionTable(
        title="Router arms: the same servers, prompts and seeds through each router",
        headers=HEADERS,
        rows=tuple(rows),
        note=(
            "each arm measured the whole sweep in turn in one job (proxy.arms), its router started, health-gated "
            "and stopped before the next; mean ± 95% t-interval over the runs given (a repeat is the same cell in "
            "another run; one run: ± ?); invalid points are left out; there is no direct arm: a PD request needs "
            "a router to carry its kv_transfer_params"
            + "".join(f"; {a}: {WITHOUT_PDBENCH_PROXY}" for a in order if a != "pdbench")
        ),
    )
