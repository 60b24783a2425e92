"""`pdbench submit`'s prediction before the run: from the runs named with --predict-from, else the
newest comparable run under the results directory (harness.predict.before_run), kept in the new
run directory as prediction.json. A named run that cannot predict is refused; a run found by
looking that cannot is said and passed over: the prediction never keeps a job from running."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.config.load import ResolvedRecipe
from harness.predict.answer import PredictError
from harness.predict.before_run import find_source, predict_before
from harness.rundir import RunDir, RunNotFound, prior_prediction
from harness.rundir.paths import PRIOR_PREDICTION
from harness.rundir.prior_prediction import PriorPrediction
from harness.submit.follow import say
from harness.submit.refused import Refused


@dataclass(frozen=True)
class Foreseen:
    prior: PriorPrediction | None  # None: off, or nothing comparable to predict from
    line: str | None  # what submit says of it once the run directory is named


def predict_first(rr: ResolvedRecipe, results_dir: Path, refs: Sequence[str], enabled: bool = True) -> Foreseen:
    """The recipe's prediction before it runs; a named source that cannot give one is refused."""
    if not enabled:
        return Foreseen(None, None)
    if refs:
        sources = [_source(ref, results_dir) for ref in refs]
    else:
        found = find_source(results_dir, rr)
        if found is None:
            return Foreseen(
                None,
                f"no prediction before the run: no earlier run of model {rr.recipe.model} with this cluster, "
                f"connector and GPUs per node under {results_dir} (--predict-from RUN names one)",
            )
        sources = [found]
    try:
        prior = predict_before(rr, sources)
    except PredictError as e:
        if refs:
            raise Refused(f"--predict-from: {e}") from None
        return Foreseen(None, f"no prediction before the run from {sources[0]}: {e}")
    return Foreseen(
        prior, f"predicted before it runs from {prior.source}: {len(prior.points)} points -> {PRIOR_PREDICTION}"
    )


def _source(ref: str, results_dir: Path) -> Path:
    """A directory of result files as given (as `pdbench predict --from` takes it), else a run."""
    if Path(ref).is_dir():
        return Path(ref)
    try:
        return RunDir.resolve(ref, results_dir).path
    except RunNotFound as e:
        raise Refused(f"--predict-from: {e}") from None


def keep(run: RunDir, foreseen: Foreseen) -> None:
    """Write the prediction into the run directory before the job starts, and say what was done."""
    if foreseen.prior is not None:
        prior_prediction.write(run.prior_prediction, foreseen.prior)
    if foreseen.line:
        say(foreseen.line)
