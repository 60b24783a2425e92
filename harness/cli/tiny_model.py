"""`pdbench tiny-model`: the tiny Llama model directory, built offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.root import command
from harness.config.load import PROJECT_ROOT


@command("tiny-model", "pdbench tiny-model /tmp/tiny-llama")
def tiny_model_cmd(
    out: Annotated[Path, typer.Argument(metavar="DIR", help="Directory to create")] = PROJECT_ROOT
    / ".cache/models/tiny-llama",
) -> None:
    """Build the tiny Llama model directory offline (config + locally trained tokenizer)."""
    from harness import tiny_model

    typer.echo(str(tiny_model.build(out)))
