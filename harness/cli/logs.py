"""`pdbench logs`: a run's logs by node and role, or followed to the job's end."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated

import typer

from harness.cli.options import RESULTS, ResultsOpt, RunArg, delegate, run_dir
from harness.cli.root import command


class LogRole(str, Enum):
    prefill = "prefill"
    decode = "decode"
    proxy = "proxy"
    bench = "bench"
    node = "node"


@command(
    "logs", "pdbench logs tiny-fp32-cpu-nixl-1p1d --role decode -n 100", "pdbench logs tiny-fp32-cpu-nixl-1p1d --follow"
)
def logs(
    run: RunArg,
    node: Annotated[int | None, typer.Option(help="Only this node's logs, by index [default: every node]")] = None,
    role: Annotated[LogRole | None, typer.Option(help="Only this role's logs [default: every role]")] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines to print from the end of each log (0: all)")] = 50,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Then print new lines as they come, until the job ends (Ctrl-C stops following)"
        ),
    ] = False,
    results_dir: ResultsOpt = RESULTS,
) -> None:
    """Print the logs of a run, by node and role."""
    from harness.submit.log_follow import follow_logs
    from harness.submit.manage import log_blocks

    found = run_dir(run, results_dir)
    if follow:
        raise typer.Exit(delegate(lambda: follow_logs(found, node, role.value if role else None, lines, sys.stdout)))
    for block in delegate(lambda: log_blocks(found, node, role.value if role else None, lines)):
        typer.echo(block)
