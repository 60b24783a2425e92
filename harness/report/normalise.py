"""Per-GPU throughput and interactivity, as InferenceX computes them (the table and `collect`)."""

from __future__ import annotations

import math


def per_gpu(total: float, output: float, prefill: int | None, decode: int | None) -> tuple[float, float, float]:
    """InferenceX's per-role normalisation (its #131): total over P+D, output over D (over P+D when
    D is 0), input (total - output) over P. NaN where the GPU split is unknown."""
    nan = math.nan
    if prefill is None or decode is None or prefill + decode <= 0:
        return nan, nan, nan
    tput = total / (prefill + decode)
    out = output / (decode if decode > 0 else prefill + decode)
    inp = (total - output) / prefill if prefill > 0 else nan
    return tput, out, inp


def interactivity(tpot_ms: float | None) -> float:
    """Tokens/s per user: 1000 / TPOT in ms (InferenceX's `*_intvty`)."""
    return 1000.0 / tpot_ms if tpot_ms else math.nan
