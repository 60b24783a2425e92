"""`pdbench`: the thin Typer layer, one module per command; each parses its options, delegates and
maps what is refused to `error: ...` and an exit code. harness.cli.root holds the app and the one
way to register a command; harness.cli.options what several commands share.

A command's module registers its command as it is imported. `main` imports only the module of
the command it runs (its name is the module's, `_` as `-`): every job starts `pdbench node`,
`proxy` and `bench` processes, and importing all nineteen modules (the recipe schema, the proxy's
aiohttp app, numpy, Jinja) cost each of them about half a second of CPU before doing anything.
`pdbench --help`, an unknown name and `harness.cli.app` import them all."""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

#: The command modules, in `pdbench --help`'s order.
MODULES = (
    "render",
    "validate",
    "submit",
    "search",
    "predict",
    "doctor",
    "recipes",
    "status",
    "logs",
    "cancel",
    "node",
    "tiny_model",
    "version",
    "proxy",
    "bench",
    "nic",
    "report",
    "collect",
    "trace_generate",
    "mock_engine",
)


def _load(modules: tuple[str, ...]) -> typer.Typer:
    for module in modules:
        importlib.import_module(f"harness.cli.{module}")
    from harness.cli.root import app, whole_summaries

    if len(modules) == len(MODULES):
        whole_summaries()
    return app


def load_all() -> typer.Typer:
    """The app with every command registered (the help's listing; tests that invoke several)."""
    return _load(MODULES)


def __getattr__(name: str) -> Any:
    if name == "app":
        return load_all()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    # The first argument names the command (the root takes no option with a value): that
    # command's module alone; anything else (none, --help, --version, a typo) all of them.
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    module = first.replace("-", "_")
    app = _load((module,) if first == module.replace("_", "-") and module in MODULES else MODULES)
    app()
