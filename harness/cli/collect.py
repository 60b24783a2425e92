"""`pdbench collect`: runs as one InferenceX-style aggregate (harness.report.report_commands)."""

from __future__ import annotations

from harness.cli.root import command
from harness.report.report_commands import collect_command

command(
    "collect",
    "pdbench collect tiny-fp32-cpu-nixl-1p1d --out agg.json --hw cpu",
    help="Write the InferenceX-style aggregate JSON of runs (validated, deduplicated).",
)(collect_command)
