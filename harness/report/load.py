"""Find and read the result files of runs: run arguments -> Runs of Points, and every file not
used as a Skipped with the reason; nothing is dropped silently.

A run argument is a run directory (pdbench's, srt-slurm's, InferenceX's), a folder of pdbench runs,
or one result file. Reading one file is result_file's job.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.report.accuracy_file import AccuracyFileError, read_accuracy
from harness.report.points import Loaded, Note, Point, Run, Skipped, dedupe_key
from harness.report.result_file import NotAResult, read_point
from harness.report.result_names import looks_like_result_name
from harness.rundir import RunDir, read_status
from harness.rundir.accuracy_summary import AccuracySummary
from harness.rundir.paths import (
    ARMS,
    CLIENTS,
    CONTROL_FILES,
    EVALS,
    POWER,
    REPEATS,
    SENTINEL_REFERENCE,
    SENTINELS,
    WORKLOADS,
    workload_subdir,
)

# A pdbench run's folders of records whose files may be named like results but are not its points:
# other clients' (the cross-check reads them), an SLO search's repeats of a point it has already
# (pdbench search reads them), the points' energy records and power windows (named after the
# result they account; harness.report.energy reads them) and the later router arms' points (the
# same points through another router: harness.report.arms sets them beside the run's own). The
# workloads' points (benchmark.workloads) are runs of their own, read by workload_runs.
RECORD_DIRS = frozenset({SENTINELS, EVALS, CLIENTS, REPEATS, POWER, ARMS, WORKLOADS})


class RunPathError(Exception):
    """A RUN_DIR argument that does not exist."""


def _not_a_result(path: Path) -> str | None:
    name = path.name
    if name.endswith(".pytorch.json"):
        return "PyTorch-benchmark sidecar of a result, not a result"
    if name.startswith("benchmark-rollup"):
        return "srt-slurm rollup of the per-point files, not a per-point result"
    if name.startswith("agg_"):
        return "InferenceX-style aggregate (collect output), not a benchmark result"
    if name.startswith("power_validation_"):
        return "InferenceX power-validation sidecar, not a benchmark result"
    return None


def candidate_files(run_path: Path) -> list[Path]:
    """A file argument is itself; a directory gives its *.json files (pdbench's control files
    excepted) and, below it, the files whose names carry a concurrency (srt-slurm nests them in
    logs/sa-bench_*/), without entering other pdbench run directories or a run's RECORD_DIRS."""
    if run_path.is_file():
        return [run_path]
    top = sorted(p for p in run_path.glob("*.json") if p.is_file() and p.name not in CONTROL_FILES)
    nested: list[Path] = []
    pdbench_run = RunDir.is_run_dir(run_path)
    for dirpath, dirnames, filenames in os.walk(run_path):
        here = Path(dirpath)
        dirnames[:] = sorted(
            n
            for n in dirnames
            if not RunDir.is_run_dir(here / n)
            and not (here == run_path and ((pdbench_run and n in RECORD_DIRS) or _bench_sentinels(here / n)))
        )
        if here != run_path:
            nested += sorted(here / f for f in filenames if looks_like_result_name(f))
    return top + nested


def _bench_sentinels(path: Path) -> bool:
    """`pdbench bench --result-dir`'s sentinel records (no run directory around them): the
    reference answers' file marks them as pdbench's own."""
    return path.name == SENTINELS and any(path.rglob(SENTINEL_REFERENCE))


def expand_runs(arg: Path) -> list[Path]:
    """A folder of pdbench runs (results/<recipe>/) without results of its own is its runs."""
    if arg.is_dir() and not RunDir.is_run_dir(arg) and not any(arg.glob("*.json")):
        runs = sorted(p for p in arg.iterdir() if p.is_dir() and RunDir.is_run_dir(p))
        if runs:
            return runs
    return [arg]


def _status(run: RunDir, skipped: list[Skipped]) -> dict[str, Any] | None:
    """The run's status.json, else the failure its nodes recorded; None when there is neither or
    it cannot be read (then listed as skipped)."""
    try:
        status = read_status(run)
        if status is not None and not isinstance(status, dict):
            raise ValueError("not an object")
    except (OSError, ValueError, TypeError) as e:
        where = run.status if run.status.is_file() else run.state
        skipped.append(Skipped(where, f"{where.name} unreadable ({e}); run state unknown"))
        return None
    return status


def _accuracy(run: RunDir, skipped: list[Skipped]) -> list[AccuracySummary]:
    """The run's accuracy evals; a summary that cannot be read is listed as skipped with why."""
    out: list[AccuracySummary] = []
    for path in run.accuracy_summaries():
        try:
            out.append(read_accuracy(path))
        except AccuracyFileError as e:
            skipped.append(Skipped(path, f"accuracy summary not used: {e}"))
    return out


def _label(run_path: Path, points: list[Point]) -> str:
    recipe = next((p.metadata.get("recipe") for p in points if p.metadata.get("recipe")), None)
    if recipe and run_path.parent.name == recipe:
        return f"{recipe}/{run_path.name}"
    return run_path.name


def _read_points(files: list[Path], run_root: Path, skipped: list[Skipped], notes: list[Note]) -> list[Point]:
    points: list[Point] = []
    for f in files:
        reason = _not_a_result(f)
        if reason:
            skipped.append(Skipped(f, reason))
            continue
        try:
            points.append(read_point(f, run_root, notes))
        except NotAResult as e:
            skipped.append(Skipped(f, str(e)))
    return points


def workload_runs(job: Run, skipped: list[Skipped], notes: list[Note]) -> list[Run]:
    """Each workload of a pdbench job (benchmark.workloads) as a run of its own: its folder
    workloads/<name>/ (laid out as a run directory), labelled `<job's label>/workloads/<name>`,
    with the job's status; its points carry the job's metadata (and metadata.workload). A workload
    that another client measured (aiperf, `vllm bench serve`) is a run without pdbench's points,
    whose clients' points the tables that read them find in its folder (the cross-check)."""
    if not job.is_pdbench_run or not job.path.is_dir():
        return []
    out = []
    for name in RunDir(job.path).workloads():
        where = job.path / workload_subdir(name)
        points = _read_points(sorted(RunDir(where).results()), where, skipped, notes)
        if not points and not RunDir(where).clients.is_dir():
            # Not measured (an earlier client failed): nothing to report, said once.
            skipped.append(Skipped(where, f"workload {name}: no result files"))
            continue
        out.append(Run(where, f"{job.label}/{workload_subdir(name)}", job.status, True, points))
    return out


def load_runs(run_paths: list[Path], labels: dict[Path, str] | None = None) -> Loaded:
    """Read every run; `Loaded.skipped` has each file not used and why. `labels` names runs by
    the path given (`--label`); a folder of runs so named gives `<label>/<run>`."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    notes: list[Note] = []
    seen: dict[Path, Run] = {}
    args: list[Path] = []
    named: dict[Path, str] = {}
    for given in run_paths:
        if not given.exists():
            raise RunPathError(f"{given}: no such run directory or result file")
        expanded = expand_runs(given)
        if expanded != [given]:
            notes.append(
                Note(given, f"a folder of runs: read as {len(expanded)} run{'' if len(expanded) == 1 else 's'}")
            )
        if labels and given in labels:
            for arg in expanded:
                named[arg] = labels[given] if arg == given else f"{labels[given]}/{arg.name}"
        args += expanded
    for arg in args:
        resolved = arg.resolve()
        if resolved in seen:
            notes.append(Note(arg, "given more than once; read once"))
            continue
        run_root = arg if arg.is_dir() else arg.parent
        status = _status(RunDir(run_root), skipped)
        files = candidate_files(arg)
        points = _read_points(files, run_root, skipped, notes)
        if not files:
            skipped.append(Skipped(arg, "no result files (*.json) in this run directory"))
        run = Run(
            path=arg,
            label=named.get(arg) or _label(run_root, points),
            status=status,
            is_pdbench_run=RunDir.is_run_dir(run_root),
            points=points,
            accuracy=_accuracy(RunDir(run_root), skipped) if arg.is_dir() else [],
        )
        seen[resolved] = run
        runs.append(run)
        runs += workload_runs(run, skipped, notes)
    counts: dict[str, int] = {}
    for run in runs:
        n = counts.get(run.label, 0) + 1
        counts[run.label] = n
        if n > 1:
            run.label = f"{run.label} ({n})"
    return Loaded(runs=runs, skipped=skipped, notes=notes)


def dedupe(loaded: Loaded) -> None:
    """Keep one point of each identity, the one with the shortest file name (the bench's own name
    rather than a CI runner's prefixed copy); list the others as skipped duplicates."""
    for run in loaded.runs:
        kept: dict[tuple[Any, ...], Point] = {}
        for p in sorted(run.points, key=lambda p: (len(p.path.name), p.path.name)):
            k = dedupe_key(run, p)
            if k in kept:
                loaded.skipped.append(
                    Skipped(
                        p.path,
                        f"duplicate of {kept[k].path.name} (same run, recipe fingerprint, serving, ISL, OSL and concurrency)",
                    )
                )
            else:
                kept[k] = p
        keep = {id(p) for p in kept.values()}
        run.points = [p for p in run.points if id(p) in keep]
