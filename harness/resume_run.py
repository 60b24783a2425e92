"""`pdbench submit --resume RUN`: a new run that keeps RUN's finished points.

The new run directory gets copies of RUN's complete, valid result files (and their
/metrics evidence), and its benchmark client runs with resume on, so only the points
without such a file are measured. RUN itself is left as it was. A job with
benchmark.workloads is not resumed (refused, either side). The two runs must
measure the same thing: everything of the resolved recipe except what only bounds or
schedules the job (Slurm options, timeouts), the ports its processes listen on (another run
may hold the old ones) and the sweep's extent (concurrency, shapes, request counts, which
the client checks point by point) must be equal.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import atomic
from harness.bench.results import BenchResult
from harness.bench.resume import incomplete, why_not_kept
from harness.config.load import ConfigError, ResolvedRecipe
from harness.rundir import LockUnreadable, ResultName, RunDir
from harness.submit.points import planned

# Keys of the resolved recipe (recipe.lock.yaml) a resumed run may change.
MAY_DIFFER = (
    "recipe.slurm",
    "recipe.timeouts",
    "recipe.description",
    "recipe.benchmark.concurrency",
    "recipe.benchmark.shapes",
    "recipe.benchmark.isl",
    "recipe.benchmark.osl",
    "recipe.benchmark.num_prompts",
    "recipe.benchmark.prompts_multiplier",
    "recipe.benchmark.min_prompts",
    "recipe.benchmark.cooldown_s",
    "recipe.benchmark.request_timeout_s",
    "recipe.benchmark.point_timeout_s",
    "recipe.benchmark.total_timeout_s",
    "recipe.benchmark.health_check_interval_s",
)


def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out |= _leaves(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return {prefix: obj}


def _is_port(key: str) -> bool:
    """A port a process listens on (topology.*.port, proxy.port, connector.*_port): where a
    server listens, not what it measures."""
    last = key.rsplit(".", 1)[-1]
    return last == "port" or last.endswith("_port")


def _compared(locked: dict[str, Any]) -> dict[str, Any]:
    keep = {k: locked[k] for k in ("recipe", "model") if k in locked}
    return {
        k: v
        for k, v in _leaves(keep).items()
        if not _is_port(k) and not any(k == p or k.startswith(p + ".") for p in MAY_DIFFER)
    }


def check_same_measurement(old_run: Path, rr: ResolvedRecipe) -> None:
    """Raise ConfigError naming the keys when RUN measured something else than RR would."""
    run = RunDir(old_run)
    lock_file = run.lock
    try:
        old = run.read_lock()
    except LockUnreadable as e:
        raise ConfigError(lock_file, "", f"cannot read the run to resume: {e}") from None
    # Only the job's own points are carried over: a resumed job with workloads would measure each
    # workload's whole sweep again, or (were they copied) keep points of another job's order. Refused
    # until a resume carries workloads/ over point by point.
    if rr.recipe.benchmark.workloads or ((old.get("recipe") or {}).get("benchmark") or {}).get("workloads"):
        raise ConfigError(
            lock_file,
            "benchmark.workloads",
            "--resume of a job with workloads is not supported yet (it could not keep their points); submit "
            "the recipe again: a new run measures the job's sweep and every workload",
        )
    before, now = _compared(old), _compared(rr.locked())
    diff = sorted(k for k in before.keys() | now.keys() if before.get(k, "(unset)") != now.get(k, "(unset)"))
    if diff:
        shown = "; ".join(f"{k}: {before.get(k, '(unset)')!r} then, {now.get(k, '(unset)')!r} now" for k in diff[:6])
        more = f" (and {len(diff) - 6} more)" if len(diff) > 6 else ""
        raise ConfigError(
            lock_file,
            diff[0],
            f"--resume needs the run to measure what {old_run.name} measured; changed: {shown}{more}",
        )


def carry_over(old_run: Path, new_run: Path) -> list[str]:
    """Copy OLD_RUN's complete, valid result files (and their metrics/) into NEW_RUN; their names."""
    kept = []
    old, new = RunDir(old_run), RunDir(new_run)
    for f in old.results():
        try:
            result = BenchResult.model_validate(json.loads(f.read_text()))
        except (OSError, ValueError, ValidationError):
            continue
        if incomplete(result) is not None:
            continue
        atomic.write_bytes(new_run / f.name, f.read_bytes(), replace=False)
        # The point's /metrics evidence (an aggregated baseline's is under metrics/aggregated/).
        phase = "aggregated" if result.metadata.get("disagg") is False else "disagg"
        name = ResultName.parse(f.name)
        if name and (evidence := old.metrics(phase) / name.point_tag).is_dir():
            shutil.copytree(evidence, new.metrics(phase) / evidence.name)
        kept.append(f.name)
    return kept


def resume_plan(old_run: Path, new_run: Path, kept: list[str]) -> tuple[list[str], int]:
    """What the resumed run keeps and what it measures, point by point, as its client will decide
    (a kept file made with other settings, such as another request count, is measured again);
    and how many points it measures (an SLO search: how many it may, its repeats as one)."""
    points = planned(RunDir(new_run), with_results=False)
    reuse, measure = [], []
    for p in points:
        why = (
            why_not_kept(p.path, p.isl, p.osl, p.concurrency, p.num_prompts, p.model, trace=p.trace)
            if p.path.is_file()
            else None
        )
        if p.path.name in kept and why is None:
            reuse.append(p.label)
        else:
            measure.append(p.label + (f" ({why})" if why else ""))
    outside = len(set(kept) - {p.path.name for p in points})
    search = json.loads(RunDir(new_run).bench_config().read_text()).get("slo_search")
    if search is not None:
        # The search decides which of the others it needs, and measures its best points again.
        lines = [
            f"resuming {old_run}: {len(kept)} finished point(s) kept (copied into the new run); the SLO search "
            f"counts {len(reuse)} of its {len(points)} ladder point(s) as measured and measures only those "
            "of the others it needs, then its repeats",
            f"  reused:  {', '.join(reuse) or 'none'}",
            f"  may measure: {', '.join(measure) or 'none'}",
        ]
        repeats = (search.get("repeats") or {}).get("max", 2)
        return lines, len(measure) + (1 if repeats else 0)
    lines = [
        f"resuming {old_run}: {len(kept)} finished point(s) kept (copied into the new run); "
        f"the sweep reuses {len(reuse)} and measures {len(measure)} of its {len(points)} point(s)",
        f"  reused:  {', '.join(reuse) or 'none'}",
        f"  measure: {', '.join(measure) or 'none'}",
    ]
    if outside:
        lines.append(f"  ({outside} kept point(s) are outside this sweep: reported, not measured)")
    return lines, len(measure)
