"""The report's TTFT breakdown: per point, the median of each part of TTFT (see
harness.bench.ttft_breakdown), as a table and as stacked bars.

The decode leg is split into the decode servers' mean KV transfer and the rest (labelled an
estimate: the transfer has no per-request values) when the point has a transfer figure.
"""

from __future__ import annotations

import io
from typing import Any

from harness.report.table import Report

HEADERS = ["Run", "Serving", "ISL", "OSL", "Conc", "TTFT p50", "Proxy", "Prefill", "KV transfer", "Decode", "Client"]
COLOURS = {
    "Proxy": "tab:gray",
    "Prefill": "tab:blue",
    "KV transfer": "tab:red",
    "Decode": "tab:green",
    "Client": "tab:olive",
}


def _median(b: dict[str, Any], key: str) -> float | None:
    part = b.get(key)
    return float(part["median"]) if isinstance(part, dict) and part.get("median") is not None else None


def parts(b: dict[str, Any]) -> dict[str, float]:
    """Bar segments in ms (medians), in the order a request meets them."""
    decode = _median(b, "decode_ms") or 0.0
    kv = b.get("kv_transfer_ms", {}).get("mean") if isinstance(b.get("kv_transfer_ms"), dict) else None
    out = {"Proxy": _median(b, "router_ms") or 0.0, "Prefill": _median(b, "prefill_ms") or 0.0}
    if kv is not None:
        out["KV transfer"] = min(float(kv), decode)
        out["Decode"] = decode - out["KV transfer"]
    else:
        out["KV transfer"], out["Decode"] = 0.0, decode
    out["Client"] = max(0.0, _median(b, "client_ms") or 0.0)
    return out


def rows(report: Report) -> list[list[str]]:
    out = []
    for run, kind, isl, osl, conc, b in report.breakdowns:
        p = parts(b)
        kv = "–" if "kv_transfer_ms" not in b else f"{p['KV transfer']:.1f}"
        prefill = "–" if "prefill_ms" not in b else f"{p['Prefill']:.1f}"
        out.append(
            [
                run,
                kind,
                str(isl),
                str(osl),
                str(conc),
                f"{_median(b, 'ttft_ms') or 0.0:.1f}",
                f"{p['Proxy']:.1f}",
                prefill,
                kv,
                f"{p['Decode']:.1f}",
                f"{p['Client']:.1f}",
            ]
        )
    return out


def png(report: Report) -> bytes:
    """Stacked horizontal bars, one per point (medians; ms)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

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
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
