"""The TTFT breakdown as table rows: per point, the median of each part in ms (markdown, HTML)."""

from __future__ import annotations

from harness.report.breakdown import median, parts
from harness.report.model import Report

HEADERS = ["Run", "Serving", "ISL", "OSL", "Conc", "TTFT p50", "Proxy", "Prefill", "KV transfer", "Decode", "Client"]


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
                f"{median(b, 'ttft_ms') or 0.0:.1f}",
                f"{p['Proxy']:.1f}",
                prefill,
                kv,
                f"{p['Decode']:.1f}",
                f"{p['Client']:.1f}",
            ]
        )
    return out
