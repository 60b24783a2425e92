"""What several commands share: their common options, naming a recipe or a run, the overrides
as records, and turning a refusal into `error: ...` with its exit code."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer

from harness import exit_codes
from harness.config.errors import ConfigError
from harness.config.load import PROJECT_ROOT
from harness.config.overrides import Override, parse_set
from harness.submit.refused import Refused

if TYPE_CHECKING:
    from harness.rundir import RunDir

RESULTS = PROJECT_ROOT / "results"


class Launcher(str, Enum):
    slurm = "slurm"
    local = "local"


SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a recipe field: key.path=value (YAML value); repeatable [default: none]",
    ),
]

# One way to name the recipe: `pdbench submit RECIPE` or `pdbench submit --recipe RECIPE`.
RecipeArg = Annotated[
    str | None,
    typer.Argument(
        metavar="RECIPE",
        show_default=False,
        help="Recipe name (recipes/<name>.yaml; `pdbench recipes` lists them) or path; or give --recipe",
    ),
]
RecipeOpt = Annotated[
    str | None,
    typer.Option("--recipe", "-r", metavar="RECIPE", help="The recipe, as the argument names it [default: none]"),
]


def recipe(ctx: typer.Context, argument: str | None, option: str | None) -> str:
    """The recipe named by the argument or by --recipe (the same one if both); else a usage error, exit 2."""
    if argument and option and argument != option:
        ctx.fail(f"two recipes named: {argument!r} and --recipe {option!r}; name one")
    name = argument or option
    if not name:
        ctx.fail("name a recipe: RECIPE or --recipe RECIPE (`pdbench recipes` lists them)")
    return name


ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        metavar="PROFILE",
        help=(
            "Cluster profile: a name (clusters/<name>.yaml; see docs/clusters.md for the search order) or a "
            "file; its settings override the recipe's, --set overrides both [default: $PDBENCH_CLUSTER, else none]"
        ),
    ),
]

SkipFlagCheck = Annotated[
    bool,
    typer.Option(
        "--skip-flag-check",
        help=(
            "Do not parse the `vllm serve` lines with the installed vLLM's parser "
            "[default: parse them whenever vLLM imports]"
        ),
    ),
]

RUN_HELP = (
    "A run: its directory, its id or short id (as `pdbench status` lists them), recipe/short-id, "
    "or a recipe name (its latest submitted run)"
)
RunArg = Annotated[str, typer.Argument(metavar="RUN", help=RUN_HELP, show_default=False)]
ResultsOpt = Annotated[Path, typer.Option(metavar="DIR", help="Root directory of run directories")]


def fail(msg: str, code: int = exit_codes.USAGE) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


T = TypeVar("T")


def delegate(step: Callable[[], T]) -> T:
    """Run a pipeline step; what it refuses becomes `error: ...` and its exit code."""
    try:
        return step()
    except Refused as e:
        fail(str(e), e.code)


def overrides(sets: list[str] | None, *typed: Override) -> list[Override]:
    """The recipe overrides in the order they apply: each `--set` parsed into its record (a
    malformed one: `error: --set KEY: ...`, exit 2), then the typed options' own records."""
    try:
        return [*(parse_set(text) for text in sets or ()), *typed]
    except ConfigError as e:
        fail(str(e))


def run_dir(ref: str, results_dir: Path) -> RunDir:
    """The run a RUN argument names, or `error: ...` and exit 2."""
    from harness.submit.pipeline import resolve_run

    return delegate(lambda: resolve_run(ref, results_dir))
