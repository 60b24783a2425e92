"""`pdbench report` and `pdbench collect`: parse, delegate, map errors to exit codes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness import atomic, exit_codes
from harness.config.load import PROJECT_ROOT
from harness.report.formats import Format

if TYPE_CHECKING:  # the model imports pandas: only `pdbench report` and `collect` should pay for it
    from harness.report.model import Report


RunsArg = Annotated[
    list[str],
    typer.Argument(help="Run directories (or result files, or a recipe name for its latest run under --results-dir)."),
]
ResultsOpt = Annotated[Path, typer.Option(help="Root directory of run directories, for recipe names.")]


def _resolve(ref: str, results_dir: Path) -> Path:
    p = Path(ref)
    if p.exists():
        return p
    from harness.rundir import RunDir, RunNotFound

    try:
        return RunDir.resolve(ref, results_dir).path
    except RunNotFound as e:
        typer.echo(f"error: {ref}: no such run directory or result file ({e})", err=True)
        raise typer.Exit(exit_codes.USAGE) from None


# As collect: a report or plot file is never written over (another run's may be in it).
_EXISTS = "{} exists; report never overwrites (choose another {})"


def _refuse_existing(path: Path, option: str) -> None:
    if path.exists():
        typer.echo(f"error: {_EXISTS.format(path, option)}", err=True)
        raise typer.Exit(exit_codes.USAGE)


def _write(path: Path, option: str, write: Callable[[Path], object]) -> None:
    """Create a report or plot file atomically (a temp file beside it, then a link: never over one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(path)
    except FileExistsError:  # created since the check at the start
        typer.echo(f"error: {_EXISTS.format(path, option)}", err=True)
        raise typer.Exit(exit_codes.USAGE) from None


def _plot_files(report: Report, plot: Path) -> list[Path]:
    """Every PNG `--plot` writes: the Pareto plot, the TTFT bars, one per shape with both kinds."""
    extra = [f"{plot.stem}-ttft{plot.suffix}"] if report.breakdowns else []
    extra += [f"{plot.stem}-{dec.tag}{plot.suffix}" for dec in report.decisions]
    return [plot, *(plot.with_name(name) for name in extra)]


def _labels(
    runs: list[str], paths: list[Path], labels: list[str], base: Path | None, base_label: str | None
) -> dict[Path, str]:
    if len(labels) > len(runs):
        typer.echo(
            f"error: --label: {len(labels)} labels for {len(runs)} run(s); give at most one per RUN, in their order",
            err=True,
        )
        raise typer.Exit(exit_codes.USAGE)
    named = list(zip(paths, labels, strict=False)) + ([(base, base_label)] if base and base_label is not None else [])
    for _, label in named:
        if not label.strip():
            typer.echo("error: --label: a label is empty; give each run a name", err=True)
            raise typer.Exit(exit_codes.USAGE)
    return {path: label.strip() for path, label in named}


def _plottable(report: Report) -> bool:
    """A point the Pareto plot can place: per-GPU throughput (a known GPU split) and interactivity."""
    from harness.report.pareto_plot import plottable

    return plottable(report)


def report_command(
    runs: RunsArg,
    baseline: Annotated[
        str | None,
        typer.Option(help="Run to compare against: signed deltas and percentages on every other row [default: none]"),
    ] = None,
    fmt: Annotated[
        Format | None,
        typer.Option(
            "--format",
            "-f",
            help="Output format [default: from --out's extension; else tables in a terminal, markdown when piped]",
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Also write the Pareto plot (tok/s/GPU vs tok/s/user) to this new PNG (never overwritten) "
            "[default: no plot]"
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Write the report to this new file (never overwritten); .txt, .md, .csv, .html or .json sets "
            "the format [default: stdout]"
        ),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(
            help="Latency bounds in ms, e.g. ttft_p99=2000,tpot_p50=30: the report names the best valid "
            "point (disaggregated or aggregated) that meets them, per ISL/OSL [default: none]"
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            help="A name for a RUN in the report, one per RUN in their order (repeat the option) [default: its directory's]"
        ),
    ] = None,
    baseline_label: Annotated[
        str | None, typer.Option(help="A name for the --baseline run [default: its directory's]")
    ] = None,
    predict: Annotated[
        bool,
        typer.Option(
            help="Add predicted against measured: each point predicted from the run's other points "
            "(docs/predict.md), with the error."
        ),
    ] = False,
    results_dir: ResultsOpt = PROJECT_ROOT / "results",
) -> None:
    """Compare runs: per-GPU throughput, TTFT/TPOT/E2EL, interactivity and failures per concurrency;
    where disaggregated and aggregated points share an ISL/OSL, their Pareto fronts and ratios.

    Example: pdbench report tiny-fp32-cpu-nixl-1p2d --baseline tiny-fp32-cpu-nixl-1p1d --out report.html"""
    from harness.report import output_csv, output_html, output_json, output_md, output_text
    from harness.report.build import build_report
    from harness.report.formats import FormatError, choose
    from harness.report.load import RunPathError
    from harness.report.slo import SLOError, parse_slo

    try:
        bounds = parse_slo(slo) if slo is not None else None
        chosen = choose(fmt, out, terminal=out is None and sys.stdout.isatty())
    except (SLOError, FormatError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(exit_codes.USAGE) from None
    if out is not None:
        _refuse_existing(out, "--out")
    if plot is not None:
        _refuse_existing(plot, "--plot")
    paths = [_resolve(r, results_dir) for r in runs]
    base = _resolve(baseline, results_dir) if baseline else None
    names = _labels(runs, paths, label or [], base, baseline_label)
    try:
        report = build_report(paths, base, slo=bounds, labels=names)
    except RunPathError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(exit_codes.USAGE) from None
    if predict:
        from harness.report.points import Note
        from harness.report.predicted import predicted_table

        predict_notes: list[Note] = []
        if (table := predicted_table(report.runs, predict_notes)) is not None:
            report.sections.append(table)
        report.notes += [f"{report.rel(n.path)}: {n.text}" for n in predict_notes]
    if plot is not None:  # the extra plots' names are known now: refuse before writing anything
        for path in _plot_files(report, plot)[1:]:
            _refuse_existing(path, "--plot")
    if plot is not None and not report.table.empty and not _plottable(report):
        typer.echo(
            f"error: --plot {plot}: no point has both a per-GPU throughput (its GPU split) and an "
            "interactivity (a TPOT p50), so the chart would be empty; nothing written (drop --plot)",
            err=True,
        )
        raise typer.Exit(exit_codes.FAILED)
    if chosen is Format.text and out is None:
        from rich.console import Console

        output_text.show(report, Console(highlight=False))
    else:
        renderers = {
            Format.text: output_text,
            Format.md: output_md,
            Format.csv: output_csv,
            Format.html: output_html,
            Format.json: output_json,
        }
        text = renderers[chosen].render(report)
        if out is not None:
            _write(out, "--out", lambda p: atomic.write_text(p, text, replace=False))
        else:
            sys.stdout.write(text)
    # A field of the wrong type is left out of what is shown: say so wherever the report went.
    for w in report.warnings:
        typer.echo(f"warning: {w}", err=True)
    # The skipped files and the --slo notes are in text/md/html/json; CSV has no room for them, and --out hides them.
    if chosen is Format.csv or out is not None:
        if report.skipped:
            typer.echo(f"skipped {len(report.skipped)} file(s):", err=True)
            for s in report.skipped:
                typer.echo(f"  {report.rel(s.path)}: {s.reason}", err=True)
        for n in report.notes:
            if n.startswith("--slo "):
                typer.echo(f"note: {n}", err=True)
        # What --slo chose is the answer asked for: said here too, not only in the file.
        from harness.report.slo_pick import TITLE

        for t in report.sections:
            if t.title.startswith(TITLE):
                for f in t.findings:
                    typer.echo(f"slo: {f}", err=True)
    if plot is not None and not report.table.empty:
        from harness.report import breakdown_plot, decision_plot
        from harness.report.pareto_plot import save

        _write(plot, "--plot", lambda p: save(report, p))
        # And where the points' TTFT went, and per shape with both kinds the disaggregated and
        # aggregated fronts beside it (in _plot_files' order).
        pngs = ([breakdown_plot.png(report)] if report.breakdowns else []) + [
            decision_plot.png(dec) for dec in report.decisions
        ]
        for extra, data in zip(_plot_files(report, plot)[1:], pngs, strict=True):
            _write(extra, "--plot", functools.partial(atomic.write_bytes, data=data, replace=False))
            typer.echo(f"plot: {extra}", err=True)
    if out is not None or plot is not None:
        typer.echo(
            f"{len(report.table)} row(s) from {len(report.runs)} run(s)"
            + (f"; report: {out}" if out else "")
            + (f"; plot: {plot}" if plot and not report.table.empty else ""),
            err=True,
        )
    if report.table.empty:
        typer.echo("error: no usable result files" + ("; no plot written" if plot else ""), err=True)
        raise typer.Exit(exit_codes.FAILED)


def collect_command(
    runs: RunsArg,
    out: Annotated[Path, typer.Option(help="Aggregate JSON to create (never overwritten).")],
    hw: Annotated[
        str | None,
        typer.Option(
            envvar="RUNNER_TYPE", help="Hardware name for points whose metadata has none [default: $RUNNER_TYPE]"
        ),
    ] = None,
    include_invalid: Annotated[
        bool, typer.Option(help='Keep points whose metadata says valid: false (they carry "valid": false).')
    ] = False,
    include_unverified: Annotated[
        bool, typer.Option(help='Keep points with no validity evidence (they carry "validity": "unverified").')
    ] = False,
    results_dir: ResultsOpt = PROJECT_ROOT / "results",
) -> None:
    """Write the InferenceX-style aggregate JSON of runs, one validated entry per point."""
    from harness.report.collect import collect, write_new
    from harness.report.load import RunPathError

    if out.exists():
        typer.echo(f"error: {out} exists; collect never overwrites (choose another --out)", err=True)
        raise typer.Exit(exit_codes.USAGE)
    paths = [_resolve(r, results_dir) for r in runs]
    try:
        result = collect(paths, hw=hw, include_invalid=include_invalid, include_unverified=include_unverified)
    except RunPathError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(exit_codes.USAGE) from None
    for s in result.skipped:
        typer.echo(f"skipped {s.path}: {s.reason}", err=True)
    for n in result.notes:
        typer.echo(f"note: {n}", err=True)
    if not result.entries:
        typer.echo("error: no point to collect; nothing written", err=True)
        raise typer.Exit(exit_codes.FAILED)
    try:
        write_new(out, result.entries)
    except FileExistsError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(exit_codes.USAGE) from None
    typer.echo(
        f"wrote {len(result.entries)} entr{'y' if len(result.entries) == 1 else 'ies'} to {out}"
        + (f" ({len(result.skipped)} file(s) skipped)" if result.skipped else "")
    )
