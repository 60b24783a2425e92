"""`report --slo` within each sweep: every point judged against the bounds (met, or which bound it
missed and by how much, or why it cannot count), and per sweep (a run's points of one serving kind
and ISL/OSL) the point of highest throughput that meets them all. This needs no aggregated
baseline, so one run gets an answer; harness.report.decide compares the kinds where both ran."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness.config.slo import result_key, violations
from harness.report.model import SectionTable

TITLE = "Under the SLO"  # the section title begins so (cli echoes its findings with --out)


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _number(v: Any) -> float | None:
    return None if _missing(v) or not math.isfinite(float(v)) else float(v)


def _integer(v: Any) -> str:
    return "n/a" if _missing(v) else str(int(v))


def _rate(row: Any) -> tuple[float | None, str]:
    """The throughput a point is ranked by: per GPU, or the total where its GPU split is unknown
    (a sweep's points share their split, so either ranks them)."""
    per_gpu = _number(row["tput_per_gpu"])
    return (per_gpu, "tok/s/GPU") if per_gpu is not None else (_number(row["total_tput"]), "tok/s in all")


def _why_not(row: Any, slo: dict[str, float]) -> list[str]:
    """Why a point cannot be chosen: an invalid point, no throughput, or each bound it misses."""
    if not _missing(row["valid"]) and not bool(row["valid"]):
        return [f"invalid ({row['validity_reasons'] or 'see the points table'})"]
    reasons = violations(slo, {result_key(k): _number(row.get(result_key(k))) for k in slo})
    if _rate(row)[0] is None:
        reasons.append("no throughput recorded")
    return reasons


def _sweep(row: Any) -> str:
    return f"{row['run']} ({row['serving']}, ISL {_integer(row['isl'])}, OSL {_integer(row['osl'])})"


def slo_table(table: pd.DataFrame, slo: dict[str, float]) -> SectionTable | None:
    """The points against the bounds, and each sweep's best point that meets them."""
    if table.empty:
        return None
    keys = list(slo)
    rows = []
    best: dict[str, tuple[float, str, int]] = {}  # sweep -> (throughput, unit, concurrency)
    counts: dict[str, tuple[int, int]] = {}  # sweep -> (points that meet the bounds, points)
    for _, r in table.iterrows():
        why = _why_not(r, slo)
        rate, unit = _rate(r)
        sweep = _sweep(r)
        met, total = counts.get(sweep, (0, 0))
        counts[sweep] = (met + (not why), total + 1)
        if not why and rate is not None and (sweep not in best or rate > best[sweep][0]):
            best[sweep] = (rate, unit, int(r["conc"]))
        values = ["n/a" if (v := _number(r.get(result_key(k)))) is None else f"{v:.1f}" for k in keys]
        rows.append(
            (
                r["run"],
                r["serving"],
                f"{_integer(r['isl'])}/{_integer(r['osl'])}",
                str(r["conc"]),
                "n/a" if rate is None else f"{rate:,.1f}" + ("" if unit == "tok/s/GPU" else " in all"),
                *values,
                "no" if why else "yes",
                "; ".join(why) or "–",
            )
        )
    bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items())
    findings = []
    for sweep, (met, total) in counts.items():
        if sweep in best:
            rate, unit, conc = best[sweep]
            findings.append(
                f"{sweep}: best under {bounds}: C={conc}, {rate:,.1f} {unit} ({met} of {total} points meet it)"
            )
        else:
            findings.append(f"{sweep}: no point meets {bounds} ({total} judged; the table says why)")
    return SectionTable(
        f"{TITLE} ({bounds})",
        ("Run", "Serving", "ISL/OSL", "Conc", "Tok/s/GPU", *(f"{k} (ms)" for k in keys), "Meets", "Why not"),
        tuple(rows),
        "Each point against every bound (an upper limit on the result's latency in ms); the best point of a "
        "sweep (a run's points of one serving kind and ISL/OSL) is the valid one of highest throughput per GPU "
        "(tok/s in all where its GPU split is unknown) that meets them all. An invalid point, or one without the "
        "bounded latency, is never chosen.",
        tuple(findings),
    )
