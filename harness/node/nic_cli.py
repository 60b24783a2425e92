"""`pdbench nic`: print this node's RDMA/TCP environment for the job script.

Registered on the main app by harness.cli.nic. In a job
script: `eval "$(pdbench nic --export --fallback-addr "$PDBENCH_NODE_ADDR")"`. Only
`export` lines go to stdout so the eval stays safe; notices go to stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from harness import exit_codes
from harness.node.nic import PROC_NET_ROUTE, SYSFS, NicError, detect, render_exports


def nic_command(
    sysfs: Annotated[Path, typer.Option(help="sysfs root to read RDMA devices (class/infiniband) from.")] = SYSFS,
    fallback_addr: Annotated[
        str | None,
        typer.Option(help="IPv4 for VLLM_NIXL_SIDE_CHANNEL_HOST when the RDMA interfaces have none [default: none]"),
    ] = None,
    export: Annotated[
        bool, typer.Option("--export/--json", help="Print `export` lines for bash eval, or a JSON object.")
    ] = True,
    route_file: Annotated[Path, typer.Option(hidden=True, help="IPv4 route table (for tests).")] = PROC_NET_ROUTE,
) -> None:
    """Detect RDMA NICs (IBDEVICES overrides) and print UCX/NCCL/NIXL settings."""
    try:
        result = detect(sysfs=sysfs, fallback_addr=fallback_addr, route_path=route_file)
    except NicError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(exit_codes.USAGE) from None
    if export:
        for notice in result.notices:
            typer.echo(f"# pdbench nic: {notice}", err=True)
        typer.echo(render_exports(result), nl=False)
    else:
        typer.echo(json.dumps(result.to_json(), indent=2))
