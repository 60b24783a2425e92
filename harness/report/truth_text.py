"""The truth tables (harness.report.truth) as report sections: a row per ISL/OSL and concurrency,
and findings that give the crossover per shape (and per concurrency along ISL), say what is
missing and which points were not compared. Every output renders them as its other sections."""

from __future__ import annotations

from collections.abc import Mapping

from harness.report.model import SectionTable
from harness.report.truth import KINDS, Cell, Side, TruthTable

NAMES = {"disagg": "disaggregated", "agg": "aggregated"}
WINNERS = {"disagg": "disagg", "agg": "agg", "tie": "tie", "neither": "neither meets", "missing": "missing"}


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def _shape(isl: int | None, osl: int | None) -> str:
    return f"ISL {'n/a' if isl is None else isl} / OSL {'n/a' if osl is None else osl}"


def _value(side: Side | None, slo: bool) -> str:
    iv = side.interval if side else None
    if side is None:
        return "–"
    if iv is None:
        return "invalid"
    if iv.n == 1:
        return f"{iv.mean:,.1f}" + (" (misses)" if slo and not side.met else "")
    meet = f", {side.met} meet" if slo and side.met < iv.n else ""
    return f"{iv.mean:,.1f} ± {iv.half_width:,.1f} (n={iv.n}{meet})"  # n >= 2: a finite half-width


def _why(cell: Cell, gpus: int) -> str:
    parts = []
    for kind in KINDS:
        side = cell.sides.get(kind)
        if side is None:
            parts.append(f"no {kind} point on {_gpus(gpus)}")
            continue
        bits = ["/".join(side.verdicts) or "no verdict"]
        bits += [f"misses {', '.join(side.misses)}"] if side.misses else []
        bits += [f"{side.invalid} invalid left out"] if side.invalid else []
        parts.append(f"{kind} {', '.join(bits)}")
    return "; ".join(parts)


def _row(cell: Cell, gpus: int, slo: bool) -> tuple[str, ...]:
    ratio = cell.ratio
    won = WINNERS[cell.winner] + (" (crossover)" if cell.crossover else "")
    return (
        "n/a" if cell.isl is None else str(cell.isl),
        "n/a" if cell.osl is None else str(cell.osl),
        str(cell.conc),
        _value(cell.sides.get("disagg"), slo),
        _value(cell.sides.get("agg"), slo),
        "–" if ratio is None else f"{ratio:.2f}x",
        won,
        _why(cell, gpus),
    )


def along(where: str, steps: list[tuple[str, str]]) -> str | None:
    """Where disagg starts to win along one axis: steps are (label, winner) in order, "missing"
    ones included (they are skipped). None when nothing along it was compared."""
    seen = [(label, w) for label, w in steps if w != "missing"]
    if not seen:
        return None
    trail = ", ".join(f"{label} {WINNERS[w]}" for label, w in seen)
    starts = [seen[i][0] for i in range(1, len(seen)) if seen[i][1] == "disagg" and seen[i - 1][1] != "disagg"]
    if all(w == "disagg" for _, w in seen):
        return f"{where}: disagg wins at every point compared, no crossover ({trail})"
    if not any(w == "disagg" for _, w in seen):
        return f"{where}: no crossover, disagg wins nowhere ({trail})"
    if not starts:
        return f"{where}: disagg wins only below {next(label for label, w in seen if w != 'disagg')} ({trail})"
    again = f", and again at {', '.join(starts[1:])}" if len(starts) > 1 else ""
    return f"{where}: disagg starts to win at {starts[0]}{again} ({trail})"


def _missing(cells: tuple[Cell, ...], gpus: int) -> list[str]:
    """What a cell lacks, once per shape and reason, with the concurrencies it concerns."""
    found: dict[tuple[str, str], list[int]] = {}
    for c in cells:
        if c.winner != "missing":
            continue
        for kind in KINDS:
            side = c.sides.get(kind)
            if side is None:
                why = f"no {NAMES[kind]} point on {_gpus(gpus)}"
            elif not side.samples:
                why = f"every {NAMES[kind]} point invalid"
            else:
                continue
            found.setdefault((_shape(c.isl, c.osl), why), []).append(c.conc)
    return [
        f"missing at {shape}, {', '.join(f'c{n}' for n in concs)}: {why}; not compared"
        for (shape, why), concs in found.items()
    ]


def findings(table: TruthTable) -> list[str]:
    out = []
    shapes = list(dict.fromkeys((c.isl, c.osl) for c in table.cells))
    for isl, osl in shapes:
        cells = [c for c in table.cells if (c.isl, c.osl) == (isl, osl)]
        line = along(_shape(isl, osl), [(f"c{c.conc}", c.winner) for c in cells])
        out += [line] if line else []
    for osl in dict.fromkeys(o for _, o in shapes):
        for conc in sorted({c.conc for c in table.cells if c.osl == osl}):
            cells = [c for c in table.cells if c.osl == osl and c.conc == conc]
            if sum(c.winner != "missing" for c in cells) < 2:
                continue
            line = along(f"OSL {osl}, c{conc}, by ISL", [(f"ISL {c.isl}", c.winner) for c in cells])
            out += [line] if line else []
    out += _missing(table.cells, table.gpus)
    for gpus, runs in table.other_gpus:
        out.append(
            f"not compared: the aggregated points on {_gpus(gpus)} ({', '.join(runs)}): no disaggregated "
            f"point of the model on {_gpus(gpus)}, and per GPU across GPU counts is not like with like"
        )
    return out


NOTE = (
    "Like with like: a row pairs the disaggregated points with the aggregated baseline of the same model, "
    "GPU count, ISL, OSL and concurrency (N replicas, or one instance over the GPUs). {what} The same row in "
    "several runs is a repeat: mean ± the 95 % t-interval's half-width (n runs). Winner: where both sides have "
    "repeats, the side whose interval lies above the other's (overlap: tie), else the higher value; "
    "(crossover) marks where disagg starts to win along a shape's concurrencies. Why: each side's bottleneck "
    "verdict (the table 'Bottleneck per point' has the evidence) and what it missed."
)
WHAT_SLO = (
    "Goodput per GPU: a valid point's total tok/s per GPU when it meets every bound, 0 when it misses one "
    "(or a request failed, or it was cut short); an invalid point is left out."
)
WHAT_NO_SLO = "No --slo: every valid point counts with its total tok/s per GPU; an invalid point is left out."


def truth_sections(tables: list[TruthTable], slo: Mapping[str, float] | None) -> list[SectionTable]:
    bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in (slo or {}).items())
    unit = "goodput/GPU" if slo else "tok/s/GPU"
    out = []
    for t in tables:
        under = f"goodput per GPU under {bounds}" if slo else "throughput per GPU, no SLO"
        out.append(
            SectionTable(
                f"Disaggregate or not: {t.model or 'model unknown'} on {_gpus(t.gpus)}, {t.disagg} against "
                f"{t.agg or 'no aggregated baseline'} ({under})",
                ("ISL", "OSL", "Conc", f"Disagg {unit}", f"Agg {unit}", "Disagg/agg", "Winner", "Why"),
                tuple(_row(c, t.gpus, bool(slo)) for c in t.cells),
                NOTE.format(what=WHAT_SLO if slo else WHAT_NO_SLO),
                tuple(findings(t)),
                words=("Winner", "Why"),
            )
        )
    return out
