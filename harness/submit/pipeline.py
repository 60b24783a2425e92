"""check -> render -> launch: a recipe into a new run directory, run by a launcher."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from harness import atomic
from harness.config.load import PROJECT_ROOT, ConfigError
from harness.config.overrides import Overrides
from harness.launch.job import LaunchError
from harness.launch.launcher import Launcher
from harness.render import current_context, render_job
from harness.rundir import RunDir, RunNotFound
from harness.submit.check import Planned, check_flags, check_secrets, check_storage, launcher_for, load, planned
from harness.submit.follow import follow, say, summary
from harness.submit.prediction import keep, predict_first
from harness.submit.refused import Refused


def resolve_run(ref: str, results_dir: Path) -> RunDir:
    try:
        return RunDir.resolve(ref, results_dir)
    except RunNotFound as e:
        raise Refused(str(e)) from None


def create_run(results_dir: Path, recipe_name: str) -> RunDir:
    """A new run directory; one that cannot be created (a read-only or full disk, a path through a
    file, no permission) is refused in one line naming the path and why, before anything runs."""
    try:
        return RunDir.create(results_dir, recipe_name)
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise Refused(
            f"--results-dir {results_dir}: cannot create a run directory under it: {e.strerror or e}{where}"
        ) from None


def render_run(p: Planned, run: RunDir, resumed_from: RunDir | None = None) -> None:
    try:
        ctx = current_context(run.path, PROJECT_ROOT, p.rr)
        render_job(p.rr, run.path, replace(ctx, resumed_from=str(resumed_from.path)) if resumed_from else ctx, p.plan)
    except ConfigError as e:  # e.g. a results directory that no #SBATCH line can carry
        raise Refused(f"{e} (run directory {run.path} left unrendered)") from None


def render_into(recipe: str, overrides: Overrides | None, cluster: str | None, skip: bool, out: Path) -> str:
    p = planned(load(recipe, overrides, cluster))
    check_flags(p, skip)
    out.mkdir(parents=True, exist_ok=True)
    try:
        render_job(p.rr, out, current_context(out, PROJECT_ROOT, p.rr), p.plan)
    except (ConfigError, FileExistsError) as e:
        raise Refused(str(e)) from None
    return f"rendered {p.rr.name} into {out}"


def submit(
    recipe: str,
    overrides: Overrides,
    cluster: str | None,
    *,
    launcher_kind: str,
    skip_flag_check: bool = False,
    dry_run: bool = False,
    wait: bool = False,
    results_dir: Path,
    resume: str | None = None,
    predict_from: Sequence[str] = (),
    predict: bool = True,
) -> int:
    """Render the recipe into a new run directory and launch it; the exit code of `pdbench submit`."""
    rr = load(recipe, overrides, cluster)
    launcher = launcher_for(launcher_kind, rr)
    p = planned(rr, launcher)
    check_flags(p, skip_flag_check)
    check_storage(p)
    check_secrets(rr, dry_run)
    resumed = resolve_run(resume, results_dir) if resume else None
    if resumed is not None:
        from harness.resume_run import check_same_measurement

        try:
            check_same_measurement(resumed.path, rr)
        except ConfigError as e:
            raise Refused(str(e)) from None
    foreseen = predict_first(rr, results_dir, predict_from, predict)
    run = create_run(results_dir, rr.name)
    render_run(p, run, resumed)
    say(f"run directory: {run.path}")
    if resumed is not None:
        from harness.resume_run import carry_over, resume_plan

        lines, to_measure = resume_plan(resumed.path, run.path, carry_over(resumed.path, run.path))
        for line in lines:
            say(line)
        if not to_measure:
            mark_not_submitted(run, f"nothing to measure: every point is kept from {resumed.path}")
            say("nothing to measure: every point of the sweep is kept; nothing submitted")
            return 0
    keep(run, foreseen)
    if dry_run:
        mark_not_submitted(run, "a dry run (--dry-run)")
        say(launcher.dry_run(run, p.plan.num_nodes))
        say("dry run: nothing submitted; the run is marked so and never counts as the recipe's latest")
        return 0
    return launch(launcher, run, p, wait)


def mark_not_submitted(run: RunDir, reason: str) -> None:
    """Record why RUN was rendered but never submitted: `status` says so, and a recipe's latest skips it."""
    atomic.write_json(run.not_submitted, {"reason": reason, "time": time.time()}, indent=2)


def launch(launcher: Launcher, run: RunDir, p: Planned, wait: bool) -> int:
    if launcher.foreground:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s pdbench %(levelname)s %(message)s")
    try:
        job = launcher.launch(run, p.plan.num_nodes)
    except LaunchError as e:
        if run.launched:  # the job started; what failed came after
            raise Refused(str(e), code=1) from None
        mark_not_submitted(run, str(e))
        raise Refused(f"{e}\nrun directory {run.path} kept, marked never submitted", code=1) from None
    if launcher.foreground:  # the job ran here, to its end
        rc = job.info().returncode
        rc = 1 if rc is None else rc
        summary(run, rc)
        return rc
    say(f"submitted {job.title}")
    return follow(job, p.rr.recipe.timeouts.job_s) if wait else 0
