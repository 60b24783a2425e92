"""Latency bounds given to the report (`--slo ttft_p99=2000,tpot_p50=30`): the parse, with
errors that name the key, and why a bound chose nothing. The keys, the result columns they bound
and the judgement are harness.config.slo's, shared with the SLO ladder and the search."""

from __future__ import annotations

import math

import pandas as pd

from harness.config.slo import SLOError, result_key

__all__ = ["SLOError", "parse_slo", "slo_notes"]


def parse_slo(text: str) -> dict[str, float]:
    """'ttft_p99=2000,tpot_p50=30' -> {'ttft_p99': 2000.0, 'tpot_p50': 30.0} (ms bounds)."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep:
            raise SLOError(f"--slo: {item!r}: expected KEY=MS, e.g. ttft_p90=2000")
        try:
            result_key(key)
        except SLOError as e:
            raise SLOError(f"--slo: {item!r}: expected KEY=MS with KEY {e}") from None
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
    """Why the disaggregated-vs-aggregated choice under `--slo` chose nothing: a bound's latency is
    in no point's result file of the shapes that have both kinds."""
    if not shapes:  # the "Under the SLO" section judges each sweep's points on its own
        return []
    rows = table[[(isl, osl) in shapes for isl, osl in zip(table["isl"], table["osl"], strict=True)]]
    return [
        f"--slo {key}: no point of those ISL/OSLs records {result_key(key)}, so none can meet it"
        for key in slo
        if result_key(key) not in rows or rows[result_key(key)].isna().all()
    ]
