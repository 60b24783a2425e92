"""CSV: the table as data, one row per run and point (deltas as `<metric>_delta`, `<metric>_pct`)."""

from __future__ import annotations

from harness.report.export import export_frame
from harness.report.model import Report


def render(report: Report) -> str:
    return export_frame(report, 4).to_csv(index=False, lineterminator="\n", na_rep="")
