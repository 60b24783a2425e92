"""Signed deltas against a baseline run: per metric, candidate - baseline and its percentage, at
the baseline row of the same serving kind, ISL, OSL and concurrency."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness.report.model import METRICS


def _key(row: pd.Series) -> str:
    return f"{row['serving']}/{row['isl']}/{row['osl']}/{row['conc']}"


def _na(v: Any) -> str:
    return "n/a" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else str(v)


def with_deltas(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The table with `<metric>_delta` and `<metric>_pct` columns (blank on baseline rows and where
    the baseline has no such point), and notes on the points compared with nothing or an invalid one."""
    cols = [m.column for m in METRICS]
    notes: list[str] = []
    if df.empty:
        for c in cols:
            df[f"{c}_delta"], df[f"{c}_pct"] = pd.Series(dtype=float), pd.Series(dtype=float)
        return df, notes
    df = df.copy()
    df["_key"] = df.apply(_key, axis=1)
    base = df[df["baseline"]][["_key", *cols]].rename(columns={c: f"{c}_base" for c in cols})
    base["_has_base"] = True
    merged = df.merge(base, on="_key", how="left")
    merged["_has_base"] = merged["_has_base"].fillna(False).astype(bool)
    for c in cols:
        b = merged[f"{c}_base"]
        delta = merged[c] - b
        pct = (delta / b * 100.0).where(b != 0)
        merged[f"{c}_delta"] = delta.where(~merged["baseline"])
        merged[f"{c}_pct"] = pct.where(~merged["baseline"])
    missing = merged[~merged["baseline"] & ~merged["_has_base"]]
    base_invalid = df[df["baseline"] & df["valid"].eq(False).fillna(False)]["_key"]
    for _, r in merged[~merged["baseline"] & merged["_key"].isin(set(base_invalid))].iterrows():
        notes.append(f"{r['run']}: conc {r['conc']} is compared with an INVALID baseline point")
    lacking: dict[str, list[str]] = {}
    for _, r in missing.iterrows():
        lacking.setdefault(r["run"], []).append(f"{_na(r['isl'])}/{_na(r['osl'])}/{r['conc']}")
    for run, keys in lacking.items():
        notes.append(f"{run}: no baseline point at ISL/OSL/conc {', '.join(keys)}; no deltas there")
    return merged.drop(columns=["_key", "_has_base", *[f"{c}_base" for c in cols]]), notes
