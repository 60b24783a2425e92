"""`pdbench version`: pdbench's version."""

from __future__ import annotations

import typer

from harness import __version__
from harness.cli.root import command


@command("version", "pdbench version")
def version() -> None:
    """Print pdbench's version."""
    typer.echo(__version__)
