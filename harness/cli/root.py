"""The `pdbench` Typer app and the one way to add a command to it: `command(name, examples)`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer

from harness import __version__
from harness.cli.formatting import Command, Group

# Help is Click's plain formatter (rich_markup_mode=None), not Rich's panels: Rich shrinks the
# option-name column to fit the terminal and cuts names ("--health-check-inte…"), while Click
# always writes a name whole (its help moves to the next line) and never narrows below 50
# columns. Up to 100 columns are used when the terminal has them (Click's own cap is 80).
# Every command is a harness.cli.formatting.Command: metavars, defaults and usage in one style.
app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100, "help_option_names": ["-h", "--help"]},
    help="Benchmark prefill/decode disaggregated vLLM serving on Slurm or on this machine.",
    epilog="Start with `pdbench recipes`, then `pdbench validate RECIPE` and `pdbench submit RECIPE`.",
)

F = TypeVar("F", bound=Callable[..., None])


def _example(*lines: str) -> str:
    """A command's help epilog: its examples, kept as written (Click's \\b: no rewrapping)."""
    return "Example:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


def command(name: str, *examples: str, help: str | None = None) -> Callable[[F], F]:
    """Register a function as `pdbench NAME`, with its examples; its help is `help`, else its docstring."""
    return app.command(name, cls=Command, help=help, epilog=_example(*examples))


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print pdbench's version and exit."),
    ] = False,
) -> None:
    """Benchmark prefill/decode disaggregated vLLM serving on Slurm or on this machine."""


def whole_summaries() -> None:
    """`pdbench --help` lists each command with its whole first paragraph, wrapped: Click
    would cut a summary that is longer than the room left at that width with "..."."""
    for info in app.registered_commands:
        if info.short_help is None:
            text = info.help or inspect.getdoc(info.callback) or ""
            info.short_help = " ".join(text.split("\n\n")[0].split())
