"""The Pareto plot: total tokens/s per GPU against tokens/s per user (1000 / median TPOT).

One line per run (per run and ISL/OSL when a report mixes them) through its Pareto-optimal points;
dominated points are drawn as faded markers, invalid points as crosses and kept off the frontier.
Uses matplotlib's Agg canvas directly: no display, no pyplot global state.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness import atomic
from harness.report import cells
from harness.report.model import Report
from harness.report.pareto import pareto_front

X_LABEL = "Interactivity (tok/s/user = 1000 / median TPOT)"
Y_LABEL = "Total throughput per GPU (tok/s/GPU)"
# The y axes the plot can have: total tok/s over every GPU (`--plot`), or output tok/s over the
# decode GPUs (the HTML's InferenceX-style chart: what a user gets out per GPU at each speed).
Y_LABELS = {
    "tput_per_gpu": Y_LABEL,
    "output_tput_per_gpu": "Output throughput per decode GPU (tok/s/GPU)",
}


def plottable(report: Report, y: str = "tput_per_gpu") -> bool:
    """Some point has both a y value (a known GPU split) and an interactivity (a TPOT p50)."""
    df = report.table
    return not df.empty and bool((df[y].notna() & df["intvty"].notna()).any())


def figure(report: Report, y: str = "tput_per_gpu") -> Figure:
    fig = Figure(figsize=(9, 6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    df = report.table
    pairs = df[["isl", "osl"]].drop_duplicates().shape[0] if not df.empty else 0
    colours = [c["color"] for c in _cycle()]
    any_invalid = False
    groups = df.groupby(["run", "serving", "isl", "osl"], sort=False, dropna=False) if not df.empty else []
    order = {run.label: i for i, run in enumerate(report.runs)}
    for i, ((run, kind, isl, osl), g) in enumerate(sorted(groups, key=lambda kv: order.get(kv[0][0], 0))):
        colour = colours[i % len(colours)]
        label = run + (" (baseline)" if run == report.baseline else "") + (" aggregated" if kind == "agg" else "")
        if pairs > 1:
            label += f" [ISL {cells.integer(isl)} / OSL {cells.integer(osl)}]"
        ok = g[[not (not cells.missing(v) and not v) for v in g["valid"]]]
        bad = g[[not cells.missing(v) and not v for v in g["valid"]]]
        pts = [(float(a), float(b)) for a, b in zip(ok["intvty"], ok[y], strict=False)]
        front = pareto_front(pts)
        if front:
            ax.plot([p[0] for p in front], [p[1] for p in front], marker="o", color=colour, label=label)
        else:
            ax.plot([], [], marker="o", color=colour, label=label + " (no plottable point)")
        others = [p for p in pts if p not in front and all(math.isfinite(v) for v in p)]
        if others:
            ax.plot(
                [p[0] for p in others],
                [p[1] for p in others],
                linestyle="none",
                marker="o",
                alpha=0.35,
                color=colour,
                label="_dominated",
            )
        if not bad.empty:
            ax.plot(
                list(bad["intvty"]),
                list(bad[y]),
                linestyle="none",
                marker="x",
                markersize=9,
                color=colour,
                label="_invalid",
            )
            any_invalid = True
        for _, r in g.iterrows():
            if math.isfinite(r["intvty"]) and math.isfinite(r[y]):
                ax.annotate(
                    f"c{r['conc']}",
                    (r["intvty"], r[y]),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=8,
                    color=colour,
                )
    if any_invalid:  # one neutral legend entry for the crosses of every run
        ax.plot([], [], linestyle="none", marker="x", markersize=9, color="black", label="invalid point (off the line)")
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(Y_LABELS[y])
    title = ("Output throughput" if y == "output_tput_per_gpu" else "Throughput") + " per GPU vs interactivity"
    if pairs == 1:
        isl, osl = df["isl"].iloc[0], df["osl"].iloc[0]
        title += f" (ISL {cells.integer(isl)}, OSL {cells.integer(osl)})"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def _cycle() -> list[dict[str, str]]:
    from matplotlib import rcParams

    return list(rcParams["axes.prop_cycle"])


def save(report: Report, path: Path) -> Figure:
    """Write the plot as a new PNG, atomically (a temp file in the same folder, then a link:
    FileExistsError rather than over a file)."""
    fig = figure(report)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_with(path, lambda f: fig.savefig(f, format="png"), replace=False)
    return fig


def png(report: Report, y: str = "tput_per_gpu") -> bytes:
    buf = io.BytesIO()
    figure(report, y).savefig(buf, format="png")
    return buf.getvalue()
