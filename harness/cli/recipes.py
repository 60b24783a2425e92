"""`pdbench recipes`: the recipes and cluster profiles there are to name."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Annotated

import typer

from harness.cli.root import command
from harness.config.load import PROJECT_ROOT


@command("recipes", "pdbench recipes", "pdbench recipes --json")
def recipes(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object [default: a list for people to read]")
    ] = False,
) -> None:
    """List the recipes and the cluster profiles there are to name, with their descriptions."""
    from harness.config.listing import listing, listing_lines

    if as_json:
        typer.echo(json.dumps(listing(PROJECT_ROOT), indent=2))
        return
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    for line in listing_lines(PROJECT_ROOT, width):
        typer.echo(line)
