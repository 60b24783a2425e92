"""A profile + a deployment + a load -> predicted TTFT/TPOT percentiles and throughput per GPU,
and the reasons it is extrapolating, if any.

The profile's per-instance service times carry over to any xP+yD whose workers have the
profiled GPUs each; the simulator (harness.predict.simulate) supplies the queueing at prefill and
decode. A prediction outside what the profile saw says so in `extrapolating`, never silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.predict.simulate import SimConfig, simulate
from harness.rundir.perf_profile import PerfProfile

SEEDS = 3  # seeded runs averaged per prediction: the percentiles' noise stays below the fits'


@dataclass(frozen=True)
class Deployment:
    phase: str  # disagg | agg
    prefill_workers: int
    decode_workers: int  # 0 for agg
    gpus_per_prefill_worker: int
    gpus_per_decode_worker: int
    # Each worker's device group, where workers share devices (CPU servers bound to the same
    # cores); () : every worker has its own. Aggregated workers are the prefill ones.
    prefill_groups: tuple[int, ...] = ()
    decode_groups: tuple[int, ...] = ()
    # The KV hand-off progresses only when the prefill engine polls between its steps (NIXL
    # without its progress thread: connector.progress_thread false).
    kv_polled: bool = False

    @property
    def gpus(self) -> int:
        return self.prefill_workers * self.gpus_per_prefill_worker + self.decode_workers * self.gpus_per_decode_worker

    @property
    def label(self) -> str:
        return (
            f"{self.prefill_workers}x agg" if self.phase == "agg" else f"{self.prefill_workers}P{self.decode_workers}D"
        )

    @classmethod
    def of(cls, profile: PerfProfile) -> Deployment:
        return cls(
            profile.phase,
            profile.prefill_workers,
            profile.decode_workers,
            profile.gpus_per_prefill_worker,
            profile.gpus_per_decode_worker,
        )


@dataclass(frozen=True)
class Prediction:
    deployment: Deployment
    concurrency: int
    isl: int
    osl: int
    ttft_ms: dict[str, float]  # mean, p50, p90, p99
    tpot_ms: dict[str, float]  # mean, p50, p90
    output_throughput: float  # tokens/s
    decode_batch: float  # running sequences per decode instance
    extrapolating: list[str] = field(default_factory=list)
    seed_throughputs: tuple[float, ...] = ()  # each seed's output tokens/s: the simulation's own spread

    @property
    def output_throughput_per_gpu(self) -> float | None:
        g = self.deployment.gpus
        return self.output_throughput / g if g else None


def _extrapolation(profile: PerfProfile, d: Deployment, isl: int, osl: int, batch: float) -> list[str]:
    out = []
    if d.phase != profile.phase:
        out.append(f"phase {d.phase}: the profile is of {profile.phase} serving")
    if (d.gpus_per_prefill_worker, d.gpus_per_decode_worker) != (
        profile.gpus_per_prefill_worker,
        profile.gpus_per_decode_worker,
    ):
        out.append(
            f"GPUs per worker {d.gpus_per_prefill_worker}/{d.gpus_per_decode_worker}: profiled "
            f"{profile.gpus_per_prefill_worker}/{profile.gpus_per_decode_worker}"
        )
    if not profile.prefill.covers(isl):
        out.append(f"isl {isl} outside the profiled {profile.prefill.x_min:g}-{profile.prefill.x_max:g}")
    lo, hi = profile.osl_range
    if not lo <= osl <= hi:
        out.append(f"osl {osl} outside the profiled {lo}-{hi}")
    if not profile.decode_step.covers(batch):
        out.append(
            f"decode batch {batch:.1f} outside the profiled "
            f"{profile.decode_step.x_min:.1f}-{profile.decode_step.x_max:.1f}"
        )
    return out


def predict(
    profile: PerfProfile, deployment: Deployment, concurrency: int, isl: int, osl: int, requests: int = 0
) -> Prediction:
    runs = []
    for seed in range(SEEDS):
        cfg = SimConfig(
            phase=deployment.phase,
            concurrency=concurrency,
            isl=isl,
            osl=osl,
            prefill_workers=deployment.prefill_workers,
            decode_workers=deployment.decode_workers,
            prefill_ms=profile.prefill.at,
            decode_step_ms=profile.decode_step.at,
            kv_ms=profile.kv_transfer_ms if deployment.phase == "disagg" else 0.0,
            overhead_ms=profile.overhead_ms,
            max_num_seqs=profile.max_num_seqs,
            max_batched_tokens=profile.max_batched_tokens,
            prefill_jitter_ms=profile.prefill.rms_ms,
            step_jitter_ms=profile.decode_step.rms_ms,
            requests=requests,
            prefill_groups=deployment.prefill_groups,
            decode_groups=deployment.decode_groups,
            kv_polled=deployment.kv_polled,
            seed=seed,
        )
        runs.append(simulate(cfg))
    ttfts = np.concatenate([r.ttft_ms for r in runs])
    tpots = np.concatenate([r.tpot_ms for r in runs]) if osl > 1 else np.zeros(1)
    batch = float(np.mean([r.mean_decode_batch for r in runs]))
    notes = _extrapolation(profile, deployment, isl, osl, batch)
    if any(r.truncated for r in runs):
        notes.append("the simulation hit its event bound: fewer requests than asked")
    return Prediction(
        deployment=deployment,
        concurrency=concurrency,
        isl=isl,
        osl=osl,
        ttft_ms={"mean": float(ttfts.mean())} | {k: float(np.percentile(ttfts, q)) for k, q in _Q},
        tpot_ms={"mean": float(tpots.mean())} | {k: float(np.percentile(tpots, q)) for k, q in _Q[:2]},
        output_throughput=float(np.mean([r.output_throughput for r in runs])),
        decode_batch=batch,
        extrapolating=notes,
        seed_throughputs=tuple(r.output_throughput for r in runs),
    )


_Q = (("p50", 50), ("p90", 90), ("p99", 99))
