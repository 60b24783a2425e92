"""The TTFT breakdown as stacked horizontal bars, one per point (medians; ms), as a PNG."""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.report.breakdown import parts
from harness.report.model import Report

COLOURS = {
    "Proxy": "tab:gray",
    "Prefill": "tab:blue",
    "KV transfer": "tab:red",
    "Decode": "tab:green",
    "Client": "tab:olive",
}


def figure(report: Report) -> Figure:
    items = report.breakdowns
    fig = Figure(figsize=(10, 1.2 + 0.35 * len(items)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = [f"{run} {kind} {isl}/{osl} c{conc}" for run, kind, isl, osl, conc, _ in items]
    left = [0.0] * len(items)
    for name, colour in COLOURS.items():
        widths = [parts(b)[name] for *_, b in items]
        ax.barh(range(len(items)), widths, left=left, color=colour, label=name)
        left = [a + w for a, w in zip(left, widths, strict=True)]
    ax.set_yticks(range(len(items)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("TTFT, median of each part (ms)")
    ax.set_title("Where TTFT goes")
    # Beside the axes, not over them: inside, the legend hid the longest points' bars.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def png(report: Report) -> bytes:
    buf = io.BytesIO()
    figure(report).savefig(buf, format="png")
    return buf.getvalue()
