"""Latency bounds (`--slo ttft_p99=2000,tpot_p50=30`): their keys, the table columns they bound,
and the parse with errors that name the key."""

from __future__ import annotations

import math

import pandas as pd

# --slo keys -> the report table's columns (latencies in ms)
SLO_COLUMNS = {
    "ttft_p50": "median_ttft_ms",
    "ttft_p99": "p99_ttft_ms",
    "ttft_p99.9": "p99.9_ttft_ms",
    "tpot_p50": "median_tpot_ms",
    "e2el_p50": "median_e2el_ms",
    "e2el_p99": "p99_e2el_ms",
}


class SLOError(ValueError):
    pass


def parse_slo(text: str) -> dict[str, float]:
    """'ttft_p99=2000,tpot_p50=30' -> {'ttft_p99': 2000.0, 'tpot_p50': 30.0} (ms bounds)."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_COLUMNS:
            raise SLOError(f"--slo: {item!r}: expected KEY=MS with KEY one of {', '.join(SLO_COLUMNS)}")
        try:
            bound = float(value)
        except ValueError:
            raise SLOError(f"--slo: {key}: {value!r} is not a number of milliseconds") from None
        if not math.isfinite(bound) or bound <= 0:
            raise SLOError(f"--slo: {key}: the bound must be a positive number of milliseconds, got {value!r}")
        out[key] = bound
    if not out:
        raise SLOError("--slo: no bound given (e.g. --slo ttft_p99=2000,tpot_p50=30)")
    return out


def slo_notes(table: pd.DataFrame, slo: dict[str, float], shapes: list[tuple[int, int]]) -> list[str]:
    """Why `--slo` chose nothing, in words: no shape has both serving kinds to choose between, or
    a bound's latency is in no point's result file of the shapes that do."""
    given = ",".join(f"{k}={v:g}" for k, v in slo.items())
    if not shapes:
        return [
            f"--slo {given}: not applied: it picks the best disaggregated or aggregated point of an "
            "ISL/OSL, and no ISL/OSL here has both (report a run that has an aggregated baseline, or "
            "a disaggregated and an aggregated run together)"
        ]
    rows = table[[(isl, osl) in shapes for isl, osl in zip(table["isl"], table["osl"], strict=True)]]
    return [
        f"--slo {key}: no point of those ISL/OSLs records {SLO_COLUMNS[key]}, so none can meet it"
        for key in slo
        if rows[SLO_COLUMNS[key]].isna().all()
    ]
