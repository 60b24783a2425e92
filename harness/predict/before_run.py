"""A run's prediction made before it is launched (`pdbench submit`): the recipe's deployments at
every point of its sweep, predicted from the profile of a run measured before, kept as the new
run's `prediction.json` (harness.rundir.prior_prediction). The bench then writes each point's
prediction and error into its result, and `pdbench report` sets them side by side.

The source is the run named with `--predict-from`, else a comparable run under the results
directory: one that measured the same model on the same cluster profile, with the same KV
connector and GPUs per node, and kept result files of the phase to predict; the newest of the
same topology, else the newest. What differs beyond
that (the xP+yD, GPUs per worker, prompt lengths, concurrency) the predictor carries over or says
it extrapolates (harness.predict.model).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.config.load import ResolvedRecipe
from harness.predict.answer import PredictError, Target, predict_point, profiles_of, targets
from harness.rundir import LockUnreadable, RunDir
from harness.rundir.perf_profile import PerfProfile
from harness.rundir.prior_prediction import PredictedPoint, PriorPrediction
from harness.rundir.result_name import ResultName

BY = "pdbench submit"
# Run directories looked at for a comparable run, newest first: the search's time stays bounded
# in a results directory of thousands of runs.
MAX_LOOKED_AT = 200


def _key(locked: dict[str, Any], cluster: str | None) -> dict[str, Any]:
    """What a profile carries over only between runs that share it."""
    recipe, model = locked.get("recipe") or {}, locked.get("model") or {}
    return {
        "model": model.get("name"),
        "precision": model.get("precision"),
        "weights": model.get("path") or model.get("hf_id"),
        "connector": (recipe.get("connector") or {}).get("name"),
        "gpus_per_node": (recipe.get("topology") or {}).get("gpus_per_node"),
        "cluster": Path(cluster).name if cluster else None,
    }


def main_phase(rr: ResolvedRecipe) -> str:
    return "agg" if rr.recipe.topology.aggregated_only else "disagg"


def _phases_measured(run: RunDir) -> set[str]:
    """The serving phases of the run's result files, by their names (a prefill/decode split or not)."""
    names = [ResultName.parse(f.name) for f in run.results()]
    return {"agg" if n.decode_gpus is None else "disagg" for n in names if n is not None}


def find_source(results_dir: Path, rr: ResolvedRecipe, exclude: Path | None = None) -> Path | None:
    """The run under `results_dir` to predict the recipe from, None where there is none: of the
    runs comparable with it (see the module's docstring) that measured its main phase, the newest
    of the same topology (nothing carried over), else the newest."""
    want = _key(rr.locked(), str(rr.cluster_file) if rr.cluster_file else None)
    topology = rr.locked()["recipe"]["topology"]
    runs = [p for p in results_dir.glob("*/*") if p.is_dir() and RunDir.is_run_dir(p)]
    runs.sort(key=lambda p: p.name, reverse=True)  # run ids begin with their UTC start time
    newest = None
    for path in runs[:MAX_LOOKED_AT]:
        if exclude is not None and path.resolve() == exclude.resolve():
            continue
        run = RunDir(path)
        try:
            lock = run.read_lock()
        except LockUnreadable:
            continue  # not a run a profile can be trusted from
        if _key(lock, lock.get("cluster_profile")) != want:
            continue
        if main_phase(rr) not in _phases_measured(run):
            continue
        if (lock.get("recipe") or {}).get("topology") == topology:
            return path
        newest = newest or path
    return newest


def _points(rr: ResolvedRecipe, target: Target, profile: PerfProfile) -> list[PredictedPoint]:
    bench, d = rr.recipe.benchmark, target.deployment
    devices = d.gpus or d.prefill_workers + d.decode_workers
    out = []
    for s in bench.shape_list():
        for c in bench.concurrency:
            pp = predict_point(profile, target, c, s.isl, s.osl, bench.num_prompts_for(c), devices)
            out.append(
                PredictedPoint(
                    concurrency=c,
                    isl=s.isl,
                    osl=s.osl,
                    ttft_p90_ms=pp.prediction.ttft_ms["p90"],
                    tpot_mean_ms=pp.prediction.tpot_ms["mean"],
                    goodput_per_device=pp.goodput_per_device,
                    band=pp.band,
                    extrapolating=list(pp.prediction.extrapolating),
                    phase=d.phase,
                )
            )
    return out


def predict_before(rr: ResolvedRecipe, sources: Sequence[Path]) -> PriorPrediction:
    """The recipe's deployments predicted from the first of `sources` with a profile of each
    phase; PredictError when none profiles the recipe's main phase."""
    fitted = [(src, p) for src in sources for p in profiles_of(src, store_it=False)]
    points: list[PredictedPoint] = []
    used: list[Path] = []
    for target in targets(rr):
        match = next(((src, p) for src, p in fitted if p.phase == target.deployment.phase), None)
        if match is None:
            if target.deployment.phase == main_phase(rr):
                names = ", ".join(str(s) for s in sources)
                raise PredictError(f"{names}: no {target.deployment.phase} points to profile the recipe's deployment")
            continue  # the job's aggregated baseline, where the source measured none
        points += _points(rr, target, match[1])
        used.append(match[0])
    return PriorPrediction(
        made_at=time.time(), source=", ".join(str(s) for s in dict.fromkeys(used)), by=BY, points=points
    )
