"""`pdbench`: the thin Typer layer, one module per command; each parses its options, delegates and
maps what is refused to `error: ...` and an exit code. harness.cli.root holds the app and the one
way to register a command; harness.cli.options what several commands share."""

from __future__ import annotations

# Each module registers its command as it is imported: this order is `pdbench --help`'s.
# isort: off
from harness.cli import (  # noqa: F401
    render,
    validate,
    submit,
    search,
    doctor,
    recipes,
    status,
    logs,
    cancel,
    node,
    tiny_model,
    version,
    proxy,
    bench,
    nic,
    report,
    collect,
    trace_generate,
    mock_engine,
)

# isort: on
from harness.cli.root import app, whole_summaries

whole_summaries()


def main() -> None:
    app()
