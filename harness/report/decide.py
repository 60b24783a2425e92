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
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from harness.report.plot import pareto_front

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


@dataclass
class FrontPoint:
    x: float
    y: float  # throughput per GPU
    run: str
    conc: int


@dataclass
class ShapeDecision:
    isl: int
    osl: int
    fronts: dict[str, list[FrontPoint]]  # kind -> front over interactivity, by x
    ttft_fronts: dict[str, list[FrontPoint]]  # kind -> front over TTFT p99 (x in ms), by x
    points: dict[str, list[FrontPoint]]  # kind -> every valid point (x interactivity)
    at_interactivity: list[tuple[float, float, float, float]]  # (tok/s/user, disagg, agg, ratio)
    at_concurrency: list[tuple[int, float, float, float]]  # (conc, disagg, agg, ratio)
    best: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # "any"/"disagg"/"agg" -> row

    @property
    def tag(self) -> str:
        return f"isl_{self.isl}_osl_{self.osl}"


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
                col = meets[SLO_COLUMNS[key]]
                meets = meets[col.notna() & (col <= bound)]
            for kind, sub in (("any", meets), *((k, meets[meets["serving"] == k]) for k in ("disagg", "agg"))):
                sub = sub[sub["tput_per_gpu"].notna()]
                dec.best[kind] = None if sub.empty else sub.loc[sub["tput_per_gpu"].idxmax()].to_dict()
        out.append(dec)
    return out


def summary_lines(decisions: list[ShapeDecision], slo: dict[str, float] | None) -> list[str]:
    """The answer in words, one line per finding (for markdown and the console)."""
    lines: list[str] = []
    for dec in decisions:
        head = f"ISL {dec.isl} / OSL {dec.osl}"
        if dec.at_interactivity:
            ratios = [r for *_, r in dec.at_interactivity]
            lines.append(
                f"{head}: at equal interactivity, disagg/agg throughput per GPU is {min(ratios):.2f}x to "
                f"{max(ratios):.2f}x over {dec.at_interactivity[0][0]:.1f}-{dec.at_interactivity[-1][0]:.1f} tok/s/user"
            )
        else:
            lines.append(f"{head}: the two fronts reach no common interactivity level (see the per-concurrency ratios)")
        if dec.at_concurrency:
            text = ", ".join(f"c{c} {r:.2f}x" for c, _, _, r in dec.at_concurrency)
            lines.append(f"{head}: at equal concurrency, disagg/agg throughput per GPU: {text}")
        if slo:
            bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items())
            best = dec.best.get("any")
            if best is None:
                lines.append(f"{head}: no valid point meets {bounds}")
            else:
                lines.append(
                    f"{head}: best under {bounds}: {best['serving']} {best['run']} at c{best['conc']}, "
                    f"{best['tput_per_gpu']:.1f} tok/s/GPU" + _other(dec, best["serving"])
                )
    return lines


def _other(dec: ShapeDecision, kind: str) -> str:
    other = "agg" if kind == "disagg" else "disagg"
    row = dec.best.get(other)
    if row is None:
        return f" (no {other} point meets it)"
    return f" ({other} best: {row['tput_per_gpu']:.1f} tok/s/GPU at c{row['conc']})"


def ratio_rows(dec: ShapeDecision) -> list[list[str]]:
    """Table rows: where, disagg tok/s/GPU, agg tok/s/GPU, ratio."""
    rows = [[f"{x:.1f} tok/s/user", f"{d:.1f}", f"{a:.1f}", f"{r:.2f}x"] for x, d, a, r in dec.at_interactivity]
    rows += [[f"c{c}", f"{d:.1f}", f"{a:.1f}", f"{r:.2f}x"] for c, d, a, r in dec.at_concurrency]
    return rows


RATIO_HEADERS = ["At", "Disagg tok/s/GPU", "Agg tok/s/GPU", "Disagg/agg"]


def figure(dec: ShapeDecision) -> Any:
    """Both Pareto curves of one shape: throughput per GPU against interactivity and against TTFT p99."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5), dpi=100)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    style = {"disagg": ("tab:blue", "disaggregated"), "agg": ("tab:orange", "aggregated")}
    for kind, (colour, name) in style.items():
        front = dec.fronts[kind]
        left.plot([p.x for p in front], [p.y for p in front], marker="o", color=colour, label=f"{name} (Pareto)")
        rest = [p for p in dec.points[kind] if (p.x, p.y) not in {(f.x, f.y) for f in front}]
        left.plot([p.x for p in rest], [p.y for p in rest], "o", alpha=0.35, color=colour, label="_dominated")
        for p in dec.points[kind]:
            if math.isfinite(p.x) and math.isfinite(p.y):
                left.annotate(f"c{p.conc}", (p.x, p.y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        tf = dec.ttft_fronts[kind]
        right.plot([p.x for p in tf], [p.y for p in tf], marker="o", color=colour, label=f"{name} (Pareto)")
        for p in tf:
            right.annotate(f"c{p.conc}", (p.x, p.y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    left.set_xlabel("Interactivity (tok/s/user = 1000 / median TPOT)")
    right.set_xlabel("TTFT p99 (ms)")
    for ax in (left, right):
        ax.set_ylabel("Total throughput per GPU (tok/s/GPU)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"Disaggregated vs aggregated, ISL {dec.isl} / OSL {dec.osl}")
    fig.tight_layout()
    return fig


def png(dec: ShapeDecision) -> bytes:
    import io

    buf = io.BytesIO()
    figure(dec).savefig(buf, format="png")
    return buf.getvalue()
