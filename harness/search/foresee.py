"""The search's prediction of a candidate before it runs, and the rule that prunes by it.

Once a disaggregated candidate has been measured, its run's profile (harness.predict: fitted
from its points, stored in its run directory) predicts every remaining candidate's xP+yD at each
ladder concurrency. Per point the prediction carries a relative band, its half-width
(harness.predict.band: the profile's residuals, the simulation's seeds and a floor for the model's
own error, widened where the prediction extrapolates).

Per SLO (judged as harness.search.outcome judges a measured run: the highest concurrency at and
below which every point meets it), the predicted objective is the goodput per device at that
concurrency; the optimistic one takes latencies × (1 - band) and throughput × (1 + band), the
pessimistic one the other way. A candidate is pruned *by prediction* only when, for every SLO,
its optimistic objective is below the best measured one (the highest mean among the finished
disaggregated candidates meeting it), or it cannot meet the SLO even optimistically: where the
bands overlap, the decision depends on the candidate and it is measured.

Modes (`predict:` in the search file):
- off: no prediction.
- order: candidates are measured in order of predicted objective, none pruned by prediction.
- prune (the default): ordered, and pruned by the rule above; a prediction that extrapolates
  (an input outside what the profile saw: harness.predict.model) is never used to prune, its
  candidate is measured. The default because its errors are bounded by what was measured: the
  band is the measured spread, the model's floor is its measured error, and where the model has
  not seen the inputs the search measures. A search that must be exact sets `off`.
- prune-all: as prune, extrapolating predictions too (the user takes that risk).
The throughput bound (harness.search.prune) runs first and is unchanged: it is sound.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harness.config.load import ResolvedRecipe
from harness.config.slo import violated_metrics
from harness.predict.answer import PredictError, predict_point, targets
from harness.predict.model import Prediction
from harness.rundir.perf_profile import PerfProfile
from harness.rundir.prior_prediction import PredictedPoint, PriorPrediction
from harness.search.outcome import CandidateOutcome
from harness.search.space import Candidate

Mode = Literal["off", "order", "prune", "prune-all"]
MODES: tuple[str, ...] = ("off", "order", "prune", "prune-all")
RULE = "prediction"  # the prediction prune's name in the state and the report
# What a predicted point can say, by the result keys harness.config.slo judges (ITL as TPOT).
_PREDICTED_KEYS = ("ttft", "tpot", "itl")


@dataclass(frozen=True)
class PointForecast:
    concurrency: int
    ttft_p90_ms: float
    tpot_mean_ms: float
    goodput_per_device: float  # total tokens/s per device
    band: float  # relative half-width
    ms: Mapping[str, float]  # result keys (p90_ttft_ms, ...) as a result file names them
    extrapolating: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "ttft_p90_ms": self.ttft_p90_ms,
            "tpot_mean_ms": self.tpot_mean_ms,
            "goodput_per_device": self.goodput_per_device,
            "band": self.band,
            "ms": dict(self.ms),
            "extrapolating": list(self.extrapolating),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PointForecast:
        return cls(
            int(d["concurrency"]),
            float(d["ttft_p90_ms"]),
            float(d["tpot_mean_ms"]),
            float(d["goodput_per_device"]),
            float(d["band"]),
            {str(k): float(v) for k, v in d["ms"].items()},
            tuple(d["extrapolating"]),
        )


@dataclass(frozen=True)
class SLOForecast:
    """One SLO: the predicted best concurrency and goodput per device there, with its band."""

    best: int | None  # None: the central prediction meets it nowhere
    objective: float | None
    low: float | None  # pessimistic (None: not even that meets it)
    high: float | None  # optimistic (None: cannot meet it even optimistically)

    def text(self) -> str:
        if self.high is None:
            return "cannot meet it even optimistically"
        mid = "none" if self.objective is None else f"{self.objective:.1f}"
        low = "none" if self.low is None else f"{self.low:.1f}"
        at = f" at c={self.best}" if self.best is not None else ""
        return f"{mid}{at} [{low}, {self.high:.1f}] tok/s/device"

    def to_json(self) -> dict[str, Any]:
        return {"best": self.best, "objective": self.objective, "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SLOForecast:
        return cls(d["best"], d["objective"], d["low"], d["high"])


@dataclass(frozen=True)
class Forecast:
    """A candidate's prediction, made before it ran, from the profile of `source`."""

    candidate: str
    source: str  # the measured run whose profile predicted it
    made_at: float
    points: tuple[PointForecast, ...]
    slos: Mapping[str, SLOForecast]
    unjudged: tuple[str, ...] = ()  # SLO bounds a prediction cannot judge (e2el): never pruned on
    # The extrapolation of the points that decide the objective: up to the first one failing an SLO
    # even optimistically (the ladder above it does not count).
    extrapolating: tuple[str, ...] = ()

    @property
    def objective(self) -> float:
        """The ordering key: the best predicted objective over the SLOs (0 where none is met)."""
        return max((s.objective or 0.0 for s in self.slos.values()), default=0.0)

    def at(self, concurrency: int) -> PointForecast | None:
        return next((p for p in self.points if p.concurrency == concurrency), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "source": self.source,
            "made_at": self.made_at,
            "points": [p.to_json() for p in self.points],
            "slos": {k: v.to_json() for k, v in self.slos.items()},
            "unjudged": list(self.unjudged),
            "extrapolating": list(self.extrapolating),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Forecast:
        return cls(
            d["candidate"],
            d["source"],
            float(d["made_at"]),
            tuple(PointForecast.from_json(p) for p in d["points"]),
            {k: SLOForecast.from_json(v) for k, v in d["slos"].items()},
            tuple(d.get("unjudged") or ()),
            tuple(d.get("extrapolating") or ()),
        )


def _ms(p: Prediction) -> dict[str, float]:
    t, d = p.ttft_ms, p.tpot_ms
    out = {"mean_ttft_ms": t["mean"], "median_ttft_ms": t["p50"], "p90_ttft_ms": t["p90"], "p99_ttft_ms": t["p99"]}
    out |= {"mean_tpot_ms": d["mean"], "median_tpot_ms": d["p50"], "p90_tpot_ms": d["p90"]}
    out |= {"mean_itl_ms": d["mean"], "median_itl_ms": d["p50"], "p90_itl_ms": d["p90"]}
    return out


def _decisive(points: Sequence[PointForecast], slos: Mapping[str, Mapping[str, float]]) -> list[PointForecast]:
    """The points the objectives rest on: up to the first failing some SLO even optimistically."""
    out = []
    for p in sorted(points, key=lambda p: p.concurrency):
        out.append(p)
        optimistic = {k: v * (1 - p.band) for k, v in p.ms.items()}
        if all(violated_metrics(b, optimistic) for b in slos.values()):
            break
    return out


def _best(points: Sequence[PointForecast], bounds: Mapping[str, float], side: int) -> tuple[int, float] | None:
    """(concurrency, goodput per device) at the highest concurrency at and below which every
    point meets the bounds; side -1 optimistic, 0 central, +1 pessimistic."""
    found = None
    for p in sorted(points, key=lambda p: p.concurrency):
        scaled = {k: v * (1 + side * p.band) for k, v in p.ms.items()}
        if violated_metrics(bounds, scaled):
            break
        found = (p.concurrency, p.goodput_per_device * (1 - side * p.band))
    return found


def forecast(
    candidate: Candidate,
    rr: ResolvedRecipe,
    profile: PerfProfile,
    source: str,
    slos: Mapping[str, Mapping[str, float]],
    ladder: Sequence[int],
) -> Forecast:
    """The candidate's predicted points on the ladder and its objective per SLO; PredictError
    when its recipe gives no deployment the profile can predict."""
    found = [t for t in targets(rr) if t.deployment.phase == profile.phase]
    if not found:
        raise PredictError(f"{candidate.name}: its recipe has no {profile.phase} deployment to predict")
    target = found[0]
    shapes = rr.recipe.benchmark.shape_list()
    if len(shapes) != 1:
        raise PredictError(f"{candidate.name}: {len(shapes)} request shapes; the search predicts one")
    shape, bench = shapes[0], rr.recipe.benchmark
    devices = candidate.devices or target.deployment.gpus or 1
    points = []
    for c in ladder:
        pp = predict_point(profile, target, c, shape.isl, shape.osl, bench.num_prompts_for(c), devices)
        p = pp.prediction
        points.append(
            PointForecast(
                c, p.ttft_ms["p90"], p.tpot_ms["mean"], pp.goodput_per_device, pp.band, _ms(p), tuple(p.extrapolating)
            )
        )
    out: dict[str, SLOForecast] = {}
    for name, bounds in slos.items():
        mid, low, high = (_best(points, bounds, side) for side in (0, 1, -1))
        out[name] = SLOForecast(
            mid[0] if mid else None, mid[1] if mid else None, low[1] if low else None, high[1] if high else None
        )
    unjudged = tuple(k for b in slos.values() for k in b if not k.startswith(_PREDICTED_KEYS))
    notes = tuple(dict.fromkeys(x for p in _decisive(points, slos) for x in p.extrapolating))
    return Forecast(candidate.name, source, time.time(), tuple(points), out, unjudged, notes)


def _incumbent(finished: Sequence[tuple[Candidate, CandidateOutcome]], slo: str) -> tuple[float, str] | None:
    """The highest measured mean goodput per device among the finished candidates meeting `slo`."""
    best: tuple[float, str] | None = None
    for m, out in finished:
        o = out.slos.get(slo)
        if m.kind != "disagg" or o is None or o.interval is None:
            continue
        if best is None or o.interval.mean > best[0]:
            best = (o.interval.mean, m.name)
    return best


def prunes(
    f: Forecast, finished: Sequence[tuple[Candidate, CandidateOutcome]], slos: Mapping[str, Any], mode: str
) -> str | None:
    """The reason to prune the candidate by its prediction, or None: measure it."""
    if mode not in ("prune", "prune-all") or f.unjudged:
        return None
    if f.extrapolating and mode != "prune-all":
        return None
    below = []
    for slo in slos:
        s = f.slos.get(slo)
        if s is None:
            return None
        if s.high is None:
            below.append(f"{slo}: predicted to meet it at no concurrency, even optimistically")
            continue
        inc = _incumbent(finished, slo)
        if inc is None or s.high >= inc[0]:
            return None  # the band reaches the best measured: the decision depends on it
        below.append(f"{slo}: predicted {s.text()}, below {inc[1]}'s measured {inc[0]:.1f}")
    extra = (
        f"; extrapolating ({'; '.join(f.extrapolating)}), pruned as predict: prune-all asks" if f.extrapolating else ""
    )
    return f"pruned by prediction (profile of {f.source}): {'; '.join(below)}{extra}"


def error(f: Mapping[str, Any] | None, outcome: CandidateOutcome | None, slo: str) -> float | None:
    """(predicted - measured) / measured of the SLO's objective, from a stored forecast."""
    if f is None or outcome is None:
        return None
    s = (f.get("slos") or {}).get(slo) or {}
    o = outcome.slos.get(slo)
    pred = s.get("objective")
    if pred is None or o is None or o.interval is None or not o.interval.mean:
        return None
    return (pred - o.interval.mean) / o.interval.mean


def prior(f: Forecast, rr: ResolvedRecipe, by: str) -> PriorPrediction:
    """The forecast as the run directory keeps it beside what the run will measure."""
    shape = rr.recipe.benchmark.shape_list()[0]
    points = [
        PredictedPoint(
            concurrency=p.concurrency,
            isl=shape.isl,
            osl=shape.osl,
            ttft_p90_ms=p.ttft_p90_ms,
            tpot_mean_ms=p.tpot_mean_ms,
            goodput_per_device=p.goodput_per_device,
            band=p.band,
            extrapolating=list(p.extrapolating),
        )
        for p in f.points
    ]
    return PriorPrediction(made_at=f.made_at, source=f.source, by=by, points=points)
