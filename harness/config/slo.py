"""Latency SLOs: their keys, the result-file keys they bound, and the judgement of one point.

One owner for the concept: a recipe's `benchmark.slo_search`, a search file's `slos` and the
report's `--slo` all name bounds the same way and judge them here.

A key is `<metric>_<stat>`: metric one of ttft, tpot, itl, e2el; stat p50 (the median), mean, or
a percentile the result files carry (p90, p99, p99.9 by default). Its bound is an upper limit
in milliseconds on the result file's key of the same meaning (`ttft_p90` -> `p90_ttft_ms`,
`tpot_p50` -> `median_tpot_ms`), the names `vllm bench serve` writes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

METRICS = ("ttft", "tpot", "itl", "e2el")
_KEY = re.compile(r"(?P<metric>ttft|tpot|itl|e2el)_(?P<stat>p50|mean|p\d{1,2}(?:\.\d+)?)")
# The metrics a prefill-side limit shows in first (queueing before, and the prefill itself) and
# those a decode-side limit shows in first (every step after the first token).
PREFILL_SIDE = frozenset({"ttft"})
DECODE_SIDE = frozenset({"tpot", "itl"})


class SLOError(ValueError):
    """A bound that is not `<metric>_<stat>` with a positive number of milliseconds."""


def result_key(key: str) -> str:
    """'ttft_p90' -> 'p90_ttft_ms', 'tpot_p50' -> 'median_tpot_ms', 'e2el_mean' -> 'mean_e2el_ms'."""
    m = _KEY.fullmatch(key)
    if m is None:
        raise SLOError(
            f"{key!r}: expected <metric>_<stat> with metric one of {', '.join(METRICS)} and stat p50, mean "
            "or a percentile such as p90, p99, p99.9"
        )
    metric, stat = m["metric"], m["stat"]
    if stat == "p50":
        return f"median_{metric}_ms"
    if stat == "mean":
        return f"mean_{metric}_ms"
    return f"{stat}_{metric}_ms"


def metric_of(key: str) -> str:
    """'ttft_p90' -> 'ttft'."""
    result_key(key)  # raises for a bad key
    return key.split("_", 1)[0]


def check_bounds(bounds: Mapping[str, float], where: str = "slo") -> dict[str, float]:
    """The bounds with their keys normalised (lower case); SLOError naming WHERE and the key."""
    if not bounds:
        raise SLOError(f"{where}: no bound given (e.g. ttft_p90: 2000, tpot_p90: 50, in ms)")
    out: dict[str, float] = {}
    for key, bound in bounds.items():
        k = str(key).strip().lower()
        try:
            result_key(k)
        except SLOError as e:
            raise SLOError(f"{where}.{key}: {e}") from None
        if isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound) or bound <= 0:
            raise SLOError(f"{where}.{key}: the bound must be a positive number of milliseconds, got {bound!r}")
        out[k] = float(bound)
    return out


def violations(bounds: Mapping[str, float], result: Mapping[str, object]) -> list[str]:
    """Every bound a point's result does not meet, in words; empty when it meets them all. A
    bound whose key the result lacks is a violation (nothing shows the point meets it)."""
    out = []
    for key, bound in bounds.items():
        rk = result_key(key)
        value = result.get(rk)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            out.append(f"{key}: the result has no {rk}")
        elif value > bound:
            out.append(f"{key} {value:.1f} ms > {bound:g} ms")
    return out


def violated_metrics(bounds: Mapping[str, float], result: Mapping[str, object]) -> set[str]:
    """The metrics (ttft, tpot, ...) whose bounds the point exceeds."""
    out = set()
    for key, bound in bounds.items():
        value = result.get(result_key(key))
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value > bound:
            out.add(metric_of(key))
    return out
