"""Each point's prediction made before the run (the run directory's prediction.json, written by
`pdbench submit` or `pdbench search`), set beside what the point measured in its result file:
`metadata.prediction` (harness.rundir.prior_prediction's check: predicted, measured, error,
band, inside). A run without a prediction, or a point it did not predict, gets none."""

from __future__ import annotations

from pathlib import Path

from harness.bench.progress import log
from harness.bench.results import BenchResult
from harness.rundir.paths import PRIOR_PREDICTION
from harness.rundir.prior_prediction import PredictionError, read


def devices(metadata: dict[str, object]) -> int | None:
    """The devices behind the point, as its metadata names them (prefill + decode, or one server's).

    Goodput per device is issue 33's definition (harness.search.outcome, from the report's
    points); the bench sits below both, so it reads back the keys it writes itself
    (point_runner.metadata) rather than importing them."""
    parts = [metadata.get(k) for k in (("prefill_gpus", "decode_gpus") if metadata.get("disagg") else ("gpus",))]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in parts):
        return None
    total = sum(parts)  # type: ignore[arg-type]  # ints, checked above
    return total or None


def with_prediction(result: BenchResult, result_dir: Path) -> None:
    """Add the point's prediction and its error to the result, where the run predicted it."""
    path = Path(result_dir) / PRIOR_PREDICTION
    if not path.is_file():
        return
    try:
        prior = read(path)
    except PredictionError as e:
        log(f"C={result.max_concurrency}: its prediction is not kept: {e}")
        return
    phase = "disagg" if result.metadata.get("disagg") else "agg"
    pp = prior.point(result.max_concurrency, result.random_input_len, result.random_output_len, phase)
    if pp is None:
        return
    n = devices(result.metadata)
    ttft, tpot = getattr(result, "p90_ttft_ms", None), getattr(result, "mean_tpot_ms", None)
    check = pp.check(ttft, tpot, result.total_token_throughput / n if n else None, prior)
    result.metadata["prediction"] = check.record()
