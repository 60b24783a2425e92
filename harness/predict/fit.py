"""Observations of one phase -> a PerfProfile: each role's service times fitted by least squares.

- prefill: the service time of a prompt vs its tokens, per prompt length at its lowest
  concurrency, and a line fitted through them (numpy.linalg.lstsq). Disaggregated, where the
  results keep the proxy's per-request legs: the median prefill leg (proxy to prefill's answer).
  Else the fastest request, which found no queue: its TTFT less the proxy's and client's time
  (and, disaggregated, the KV hand-off and decode's first step). With one prompt length only, the time is taken as
  proportional to the tokens (prefill is compute-bound, so a batch of k prompts costs about k
  times one), flagged by r2 None.
- decode step vs running batch: a point's step time is its mean TPOT, at the batch its requests
  decoded alongside (harness.predict.simulate.seen_batch; by Little's law where the results keep
  no per-request times); a line through the points (lstsq). An aggregated instance's TPOT also carries the prompts its
  steps computed, so there the line is refined (scipy.optimize.least_squares) until the simulator
  (harness.predict.simulate), which adds those stalls itself, gives the measured TPOTs.
- KV hand-off: disaggregated, where the proxy's legs are kept, the median decode leg (prefill's
  answer to the first token) less decode's first step at each prompt length's lowest
  concurrency; else the median of the points' KV transfer, as harness.predict.observe reads it.
- proxy/client time: the median of the points' router and client legs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from harness.predict.limits import DEFAULT, Limits
from harness.predict.observe import Observation
from harness.predict.simulate import SimConfig, simulate
from harness.rundir.perf_profile import LinearFit, PerfProfile

CALIBRATION_REQUESTS = 256  # per point in the aggregated refinement: bounded time per evaluation


class FitError(Exception):
    pass


def line(x: Sequence[float], y: Sequence[float], what: str, proportional_if_flat: bool) -> LinearFit:
    """Least squares y = a + b x with its residuals' rms and R^2; x that never varies (within 2 %)
    gives a constant (or, proportional_if_flat, y/x through the origin) and r2 None."""
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    if xs.size == 0:
        raise FitError(f"no observations of {what}")
    flat = xs.max() - xs.min() <= 0.02 * max(abs(xs.max()), 1e-9)
    if flat:
        if proportional_if_flat and xs.mean() > 0:
            a, b = 0.0, float(ys.mean() / xs.mean())
        else:
            a, b = float(ys.mean()), 0.0
        r2 = None
    else:
        design = np.column_stack([np.ones_like(xs), xs])
        (a, b), *_ = np.linalg.lstsq(design, ys, rcond=None)
        if b < 0:  # a time that falls with more work is noise: take the constant
            a, b = float(ys.mean()), 0.0
        ss_tot = float(((ys - ys.mean()) ** 2).sum())
        ss_res = float(((ys - (a + b * xs)) ** 2).sum())
        r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else None
    rms = float(np.sqrt(((ys - (a + b * xs)) ** 2).mean()))
    return LinearFit(
        x=what,
        intercept_ms=float(a),
        slope_ms=float(b),
        n=int(xs.size),
        x_min=float(xs.min()),
        x_max=float(xs.max()),
        rms_ms=rms,
        r2=r2,
    )


def _decode_instances(o: Observation) -> int:
    return o.decode_workers if o.phase == "disagg" else o.prefill_workers


def decode_batch(o: Observation) -> float:
    """Running sequences per decode instance: the batch a request decoded alongside, from the
    per-request times (harness.predict.simulate.seen_batch): itself and, of the others decoding
    with it on any instance, its instance's even share (round-robin). Where the result does not
    keep those times, the time average by Little's law (requests/s x seconds decoding), which is
    under the batch the steps ran at wherever decode sat idle at times."""
    if o.decode_batch_seen is not None:
        return max(1.0, 1.0 + (o.decode_batch_seen - 1.0) / _decode_instances(o))
    per_instance = o.output_throughput / o.osl / _decode_instances(o)
    steps = o.osl if o.phase == "disagg" else o.osl - 1
    return max(1.0, per_instance * steps * o.tpot_ms / 1000.0)


def _sim_config(
    profile: PerfProfile, o: Observation, requests: int = 0, jitter: bool = True, seed: int = 0
) -> SimConfig:
    return SimConfig(
        phase=profile.phase,
        concurrency=o.concurrency,
        isl=o.isl,
        osl=o.osl,
        prefill_workers=o.prefill_workers,
        decode_workers=o.decode_workers,
        prefill_ms=profile.prefill.at,
        decode_step_ms=profile.decode_step.at,
        kv_ms=profile.kv_transfer_ms,
        overhead_ms=profile.overhead_ms,
        max_num_seqs=profile.max_num_seqs,
        max_batched_tokens=profile.max_batched_tokens,
        prefill_jitter_ms=profile.prefill.rms_ms if jitter else 0.0,
        step_jitter_ms=profile.decode_step.rms_ms if jitter else 0.0,
        requests=requests,
        seed=seed,
    )


def _refine_agg(profile: PerfProfile, obs: Sequence[Observation]) -> LinearFit:
    """The aggregated decode line such that the simulated TPOTs meet the measured ones."""
    d0 = profile.decode_step
    measured = np.array([o.tpot_ms for o in obs])

    def line_of(theta: np.ndarray) -> dict[str, float]:
        return {"intercept_ms": float(theta[0]), "slope_ms": float(theta[1]) if len(theta) > 1 else d0.slope_ms}

    def residuals(theta: np.ndarray) -> np.ndarray:
        step = d0.model_copy(update=line_of(theta) | {"rms_ms": 0.0})
        p = profile.model_copy(update={"decode_step": step})
        sims = [simulate(_sim_config(p, o, min(o.requests, CALIBRATION_REQUESTS), jitter=False)) for o in obs]
        return np.array([np.mean(s.tpot_ms) if s.tpot_ms else 0.0 for s in sims]) / measured - 1.0

    # A batch that never varied fixes the intercept only: the slope stays what the line said (0).
    free = 2 if d0.r2 is not None else 1
    x0 = np.array([max(d0.intercept_ms, 1e-3), max(d0.slope_ms, 0.0)])[:free]
    scale = np.array([max(x0[0], 1e-3), max(x0[0] / max(d0.x_max, 1.0), 1e-6)])[:free]
    fit = least_squares(
        residuals, x0, bounds=([0.0] * free, [np.inf] * free), x_scale=scale, diff_step=0.05, max_nfev=40
    )
    rel = residuals(fit.x)
    return d0.model_copy(update=line_of(fit.x) | {"rms_ms": float(np.sqrt(((rel * measured) ** 2).mean()))})


def fit_profile(
    obs: Sequence[Observation],
    run: Path,
    engine: Limits = DEFAULT,
) -> PerfProfile:
    """The profile of one phase's observations (all of one phase and deployment), whose engines
    had the `engine` limits (max_num_seqs, max_batched_tokens)."""
    if not obs:
        raise FitError(f"{run}: no points to fit a profile from")
    phases = {o.phase for o in obs}
    if len(phases) != 1:
        raise FitError(f"{run}: points of both phases ({', '.join(sorted(phases))}): fit each phase apart")
    phase = obs[0].phase
    layouts = {(o.prefill_workers, o.decode_workers, o.prefill_gpus, o.decode_gpus) for o in obs}
    if len(layouts) != 1:
        raise FitError(f"{run}: points of different deployments {sorted(layouts)}: fit each apart")
    overheads = [o.overhead_ms for o in obs if o.overhead_ms is not None]
    kvs = [o.kv_ms for o in obs if o.kv_ms is not None]
    overhead = statistics.median(overheads) if overheads else 0.0
    kv = statistics.median(kvs) if kvs else 0.0
    kv_source = next((o.kv_source for o in obs if o.kv_ms is not None), "none")

    # Per prompt length, its lowest concurrency's point: there nothing queued (at C=1) or least.
    lowest: dict[int, Observation] = {}
    for o in obs:
        if o.isl not in lowest or o.concurrency < lowest[o.isl].concurrency:
            lowest[o.isl] = o
    legs = [
        (o.isl, o.concurrency, o.prefill_leg_ms, o.decode_leg_ms - o.tpot_ms)
        for o in lowest.values()
        if o.prefill_leg_ms is not None and o.decode_leg_ms is not None and o.concurrency == 1
    ]
    split = phase == "disagg" and len(legs) == len(lowest)
    fastest: dict[int, tuple[int, float]] = {}
    if split:
        # At C=1 no request queues, so the proxy's legs, which split the TTFT where prefill
        # answered, are services: the median prefill leg is the prompt's; the decode leg less
        # decode's first step is the hand-off: the KV transfer and decode's taking in the
        # request. The KV bytes over their rate leave the latter out (1P1D on the local cluster
        # at C=1: 6.0 ms by the bytes, 15.9 ms by the legs), and the fastest request's TTFT less
        # them gave prefill the rest, from the fastest, not the typical, request.
        kv = statistics.median(max(handoff, 0.0) for *_, handoff in legs)
        kv_source = "ttft_breakdown legs"
        fastest = {isl: (c, max(leg, 0.01)) for isl, c, leg, _ in legs}
    # Else the lowest concurrency's fastest request: there decode's first step is taken at the
    # batch its TPOT was measured at; at a high concurrency the fastest request's first step can
    # run at a smaller batch than the point's mean TPOT says, and the difference would take the
    # prompt's whole time away.
    for o in obs if not split else ():
        before = overhead + (kv + o.tpot_ms if phase == "disagg" else 0.0)
        service = max(o.ttft_min_ms - before, 0.01)
        fastest[o.isl] = min(fastest.get(o.isl, (o.concurrency, service)), (o.concurrency, service))
    prefill = line(list(fastest), [v for _, v in fastest.values()], "prompt_tokens", proportional_if_flat=True)
    decode = line([decode_batch(o) for o in obs], [o.tpot_ms for o in obs], "decode_batch", proportional_if_flat=False)
    o0 = obs[0]
    profile = PerfProfile(
        phase=phase,
        prefill=prefill,
        decode_step=decode,
        kv_transfer_ms=kv,
        kv_source=kv_source,
        overhead_ms=overhead,
        prefill_workers=o0.prefill_workers,
        decode_workers=o0.decode_workers,
        gpus_per_prefill_worker=o0.prefill_gpus // o0.prefill_workers,
        gpus_per_decode_worker=o0.decode_gpus // o0.decode_workers if o0.decode_workers else 0,
        max_num_seqs=engine[0],
        max_batched_tokens=engine[1],
        osl_range=(min(o.osl for o in obs), max(o.osl for o in obs)),
        concurrency_range=(min(o.concurrency for o in obs), max(o.concurrency for o in obs)),
        points=[_relative(o.path, run) for o in obs],
    )
    if phase == "agg":
        profile = profile.model_copy(update={"decode_step": _refine_agg(profile, obs)})
    return profile


def _relative(path: Path, run: Path) -> str:
    try:
        return str(path.resolve().relative_to(run.resolve()))
    except ValueError:
        return str(path)
