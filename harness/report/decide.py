"""Does disaggregation pay? Per ISL/OSL shape, the disaggregated and aggregated Pareto fronts,
their throughput-per-GPU ratio, and the best configuration that meets an SLO.

A report that holds both kinds of point for a shape (a run with its aggregated baseline, or
runs of each kind side by side) gets one `ShapeDecision` per shape:
  - the Pareto front of each kind over every run in the report: total tok/s/GPU against
    interactivity (tok/s/user; both higher is better) and against TTFT p99 (lower is better);
  - the ratio disagg/agg of throughput per GPU at each interactivity level both fronts reach
    (each front interpolated linearly between its points, never extrapolated), and at each
    concurrency both kinds ran;
  - with an SLO (`--slo ttft_p99=2000,tpot_p50=30`), the valid point of highest throughput per
    GPU that meets every bound, overall and per kind.
Invalid points are kept off the fronts and out of the choice, as in the Pareto plot.
"""

from __future__ import annotations

import itertools
import math

import pandas as pd

from harness.config.slo import result_key
from harness.report.model import FrontPoint, ShapeDecision
from harness.report.pareto import pareto_front


def _usable(df: pd.DataFrame) -> pd.DataFrame:
    ok = [not (v is not pd.NA and v is not None and not pd.isna(v) and not v) for v in df["valid"]]
    return df[ok]


def _front(rows: pd.DataFrame, xcol: str, lower_x_better: bool = False) -> list[FrontPoint]:
    pts = {}
    for _, r in rows.iterrows():
        x, y = float(r[xcol]), float(r["tput_per_gpu"])
        if math.isfinite(x) and math.isfinite(y):
            pts[(-x if lower_x_better else x, y)] = (r["run"], int(r["conc"]))
    front = pareto_front(list(pts))
    out = [FrontPoint(-x if lower_x_better else x, y, *pts[(x, y)]) for x, y in front]
    return sorted(out, key=lambda p: p.x)


def _interp(front: list[FrontPoint], x: float) -> float:
    """The front's throughput at interactivity x (linear between its points; NaN outside)."""
    if not front or x < front[0].x or x > front[-1].x:
        return math.nan
    for a, b in itertools.pairwise(front):
        if a.x <= x <= b.x:
            return a.y if b.x == a.x else a.y + (b.y - a.y) * (x - a.x) / (b.x - a.x)
    return front[-1].y


def decide(table: pd.DataFrame, slo: dict[str, float] | None = None) -> list[ShapeDecision]:
    """One decision per ISL/OSL shape that has both disaggregated and aggregated points."""
    out: list[ShapeDecision] = []
    if table.empty or "serving" not in table:
        return out
    for (isl, osl), g in table.groupby(["isl", "osl"], sort=True, dropna=True):
        if set(g["serving"]) != {"disagg", "agg"}:
            continue
        rows = _usable(g)
        kinds = {k: rows[rows["serving"] == k] for k in ("disagg", "agg")}
        fronts = {k: _front(r, "intvty") for k, r in kinds.items()}
        ttft = {k: _front(r, "p99_ttft_ms", lower_x_better=True) for k, r in kinds.items()}
        points = {
            k: [
                FrontPoint(float(x), float(y), run, int(c))
                for x, y, run, c in zip(r["intvty"], r["tput_per_gpu"], r["run"], r["conc"], strict=False)
            ]
            for k, r in kinds.items()
        }
        d, a = fronts["disagg"], fronts["agg"]
        levels: list[tuple[float, float, float, float]] = []
        if d and a:
            lo, hi = max(d[0].x, a[0].x), min(d[-1].x, a[-1].x)
            for x in sorted({p.x for p in d + a if lo <= p.x <= hi}):
                yd, ya = _interp(d, x), _interp(a, x)
                if math.isfinite(yd) and math.isfinite(ya) and ya > 0:
                    levels.append((x, yd, ya, yd / ya))
        by_conc: list[tuple[int, float, float, float]] = []
        for conc in sorted(set(kinds["disagg"]["conc"]) & set(kinds["agg"]["conc"])):
            yd = kinds["disagg"][kinds["disagg"]["conc"] == conc]["tput_per_gpu"].max()
            ya = kinds["agg"][kinds["agg"]["conc"] == conc]["tput_per_gpu"].max()
            if math.isfinite(yd) and math.isfinite(ya) and ya > 0:
                by_conc.append((int(conc), float(yd), float(ya), float(yd / ya)))
        dec = ShapeDecision(int(isl), int(osl), fronts, ttft, points, levels, by_conc)
        if slo:
            meets = rows
            for key, bound in slo.items():
                if result_key(key) not in meets:  # no point records it: none meets it
                    meets = meets.iloc[0:0]
                    break
                col = meets[result_key(key)]
                meets = meets[col.notna() & (col <= bound)]
            for kind, sub in (("any", meets), *((k, meets[meets["serving"] == k]) for k in ("disagg", "agg"))):
                sub = sub[sub["tput_per_gpu"].notna()]
                dec.best[kind] = None if sub.empty else sub.loc[sub["tput_per_gpu"].idxmax()].to_dict()
        out.append(dec)
    return out
