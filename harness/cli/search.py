"""`pdbench search`: a search file's candidates run as jobs, the best deployment per SLO."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.options import RESULTS, ClusterOpt, Launcher, ResultsOpt, SetOpt, SkipFlagCheck, delegate
from harness.cli.root import command


@command(
    "search",
    "pdbench search local-tiny-pd --cluster local",
    "pdbench search searches/my-h200.yaml --search-dir results/searches/h200-try2",
)
def search(
    name: Annotated[
        str,
        typer.Argument(
            metavar="SEARCH",
            show_default=False,
            help="Search file: a name (searches/<name>.yaml) or a path",
        ),
    ],
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
    launcher: Annotated[
        Launcher, typer.Option(help="How to run each candidate's job: slurm (sbatch) or local (this machine).")
    ] = Launcher.slurm,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--search-dir",
            metavar="DIR",
            help="The search directory; running again with the same one resumes the search "
            "[default: <results-dir>/searches/<search name>]",
        ),
    ] = None,
    results_dir: ResultsOpt = RESULTS,
    skip_flag_check: SkipFlagCheck = False,
    from_run: Annotated[
        Path | None,
        typer.Option(
            "--from",
            metavar="RUN",
            help="A measured disaggregated run whose profile predicts the candidates from the start "
            "(the search's `predict:`; without it, the first candidate measured)",
        ),
    ] = None,
) -> None:
    """Find the best deployment: run a search file's candidates (xP+yD, per-role parallelism, any
    recipe key) as jobs, each up its concurrency ladder to the highest point that meets the SLO, and
    report the winner per SLO with its confidence interval, the aggregated baseline and the cost.
    Running it again resumes: finished candidates are kept."""
    from harness.search.driver import prepare

    # --set stays text here: it joins the search file's own `set:` list, which the search
    # directory records and a resume must give again; each candidate's load parses it.
    rc = delegate(
        lambda: prepare(
            name,
            search_dir=directory,
            results_dir=results_dir,
            launcher_kind=launcher.value,
            cluster=cluster,
            overrides=list(set_ or []),
            skip_flag_check=skip_flag_check,
            from_run=from_run,
        ).run()
    )
    raise typer.Exit(rc)
