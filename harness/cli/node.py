"""`pdbench node`: this node's part of a job, run by server.sh inside the allocation."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.root import command


@command("node", "pdbench node --run-dir results/tiny-fp32-cpu-nixl-1p1d/RUN --node-id 0")
def node(
    run_dir: Annotated[Path, typer.Option("--run-dir", metavar="DIR", help="The job's run directory")],
    node_id: Annotated[int | None, typer.Option(help="This node's index in the job [default: $SLURM_NODEID]")] = None,
) -> None:
    """Run this node's part of a job (called by server.sh inside the allocation)."""
    from harness.node.runtime import run_node

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s pdbench-node %(levelname)s %(message)s"
    )
    raise typer.Exit(run_node(run_dir, node_id))
