"""Both Pareto curves of one shape as a PNG: throughput per GPU against interactivity and against
TTFT p99, disaggregated beside aggregated (matplotlib's Agg canvas; no pyplot global state)."""

from __future__ import annotations

import io
import math

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.report.model import ShapeDecision


def figure(dec: ShapeDecision) -> Figure:
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
    buf = io.BytesIO()
    figure(dec).savefig(buf, format="png")
    return buf.getvalue()
