"""The table as data outputs (CSV, JSON) carry it: rounded, counts as integers."""

from __future__ import annotations

import pandas as pd

from harness.report.model import Report


def export_frame(report: Report, decimals: int) -> pd.DataFrame:
    df = report.table.round(decimals)
    for col in ("failed", "failed_delta", "ttft_breakdown_requests"):
        if col in df:
            df[col] = df[col].astype("Int64")
    return df
