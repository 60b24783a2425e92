"""`pdbench report`: runs compared (harness.report.report_commands)."""

from __future__ import annotations

from harness.cli.root import command
from harness.report.report_commands import report_command

command(
    "report",
    "pdbench report tiny-fp32-cpu-nixl-1p1d tiny-fp32-cpu-nixl-1p2d --baseline tiny-fp32-cpu-nixl-1p1d",
    help="Compare runs: tables (md/csv/html/json) with baseline deltas, Pareto plot.",
)(report_command)
