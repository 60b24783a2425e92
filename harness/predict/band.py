"""A prediction's relative half-width: how far the measurement may fall from it.

    band = max(FLOOR, Z x sqrt(prefill_rel² + decode_rel² + seeds_rel²)) x (WIDEN if extrapolating)

prefill_rel and decode_rel are the profile's residual rms over its fitted time at the point (the
fit's own spread), seeds_rel the spread of the simulation's seeds' throughputs. FLOOR stands for
the model's error the residuals do not show (docs/predict.md: 1 % on the mock, 5-11 % median on
the H200 aggregated run). The search prunes by it (harness.search.foresee); every prediction made
before a run keeps it (harness.predict.before_run).
"""

from __future__ import annotations

import math
import statistics

from harness.predict.model import Prediction
from harness.rundir.perf_profile import PerfProfile

Z = 2.0  # half-widths in standard deviations
FLOOR = 0.05  # the least relative half-width: the model's error its residuals do not show
WIDEN = 2.0  # the band of a prediction outside what the profile saw


def _rel(rms: float, at: float) -> float:
    return rms / at if at > 0 else 0.0


def band_of(profile: PerfProfile, p: Prediction) -> float:
    """The prediction's relative half-width (see the module's docstring)."""
    pre = _rel(profile.prefill.rms_ms, profile.prefill.at(p.isl))
    dec = _rel(profile.decode_step.rms_ms, profile.decode_step.at(max(p.decode_batch, 1.0)))
    seeds = p.seed_throughputs
    spread = statistics.stdev(seeds) / statistics.fmean(seeds) if len(seeds) > 1 and statistics.fmean(seeds) else 0.0
    band = max(FLOOR, Z * math.sqrt(pre**2 + dec**2 + spread**2))
    return band * (WIDEN if p.extrapolating else 1.0)
