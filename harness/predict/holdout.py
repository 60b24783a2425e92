"""Predicted against measured: each point of a run predicted from a profile fitted on the run's
OTHER points of the same phase (leave-one-out), so every figure is a real prediction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.predict.fit import FitError, fit_profile
from harness.predict.limits import DEFAULT, Limits
from harness.predict.model import Deployment, Prediction, predict
from harness.predict.observe import Observation

# What is compared: (name, measured, predicted).
METRICS = ("p90_ttft_ms", "mean_tpot_ms", "output_tps_per_gpu")


@dataclass(frozen=True)
class Checked:
    observed: Observation
    predicted: Prediction | None  # None: too few other points to fit from
    why_not: str | None = None

    def pair(self, metric: str) -> tuple[float, float | None]:
        o, p = self.observed, self.predicted
        if metric == "p90_ttft_ms":
            return o.ttft_ms["p90"], p.ttft_ms["p90"] if p else None
        if metric == "mean_tpot_ms":
            return o.tpot_ms, p.tpot_ms["mean"] if p else None
        per_gpu = o.output_throughput / o.gpus if o.gpus else o.output_throughput
        pred = (p.output_throughput_per_gpu or p.output_throughput) if p else None
        return per_gpu, pred

    def error(self, metric: str) -> float | None:
        """(predicted - measured) / measured."""
        m, p = self.pair(metric)
        return None if p is None or m == 0 else (p - m) / m


def leave_one_out(
    obs: Sequence[Observation], run: Path, engines: Mapping[str, Limits] | None = None, kv_polled: bool = False
) -> list[Checked]:
    """Every observation predicted from the others of its phase; a phase needs 2 points. `engines`:
    per phase the engine limits the run had (harness.predict.limits), else vLLM's defaults;
    `kv_polled`: its KV hand-off progressed only between prefill's steps (limits.kv_polled)."""
    out: list[Checked] = []
    for phase in sorted({o.phase for o in obs}):
        group = [o for o in obs if o.phase == phase]
        for i, held in enumerate(group):
            rest = group[:i] + group[i + 1 :]
            if not rest:
                out.append(Checked(held, None, "no other point of this phase to fit from"))
                continue
            try:
                profile = fit_profile(rest, run, (engines or {}).get(phase, DEFAULT))
            except FitError as e:
                out.append(Checked(held, None, str(e)))
                continue
            d = Deployment(
                phase,
                held.prefill_workers,
                held.decode_workers,
                held.prefill_gpus // held.prefill_workers,
                held.decode_gpus // held.decode_workers if held.decode_workers else 0,
                kv_polled=kv_polled and phase == "disagg",
            )
            out.append(Checked(held, predict(profile, d, held.concurrency, held.isl, held.osl, held.requests)))
    return out


def median_abs_error(checked: Sequence[Checked], metric: str) -> float | None:
    errs = [abs(e) for c in checked if (e := c.error(metric)) is not None]
    return float(np.median(errs)) if errs else None
