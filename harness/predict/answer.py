"""`pdbench predict`'s work: a recipe's deployments and sweep, profiles fitted from the named runs
(each stored in its run directory), and a table of predictions per concurrency. Runs nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.config.load import ResolvedRecipe
from harness.predict.band import band_of
from harness.predict.fit import FitError, fit_profile
from harness.predict.limits import DEFAULT, LimitsError, limits, of_run
from harness.predict.model import Deployment, Prediction, predict
from harness.predict.observe import ObservationError, observations
from harness.rundir import RunDir
from harness.rundir import perf_profile as store
from harness.rundir.perf_profile import PerfProfile
from harness.topology import Role, plan


class PredictError(Exception):
    """Bad input: the message names the run, file or recipe key."""


@dataclass(frozen=True)
class Target:
    deployment: Deployment
    max_num_seqs: int
    max_batched_tokens: int
    key: str  # the recipe key the deployment comes from


def device_groups(rr: ResolvedRecipe, role: Role) -> tuple[int, ...]:
    """Each of the role's workers' device group: on CPU sites the workers bound to the same cores
    share them (on whichever node: the local cluster's nodes are one machine, as the search's
    capacity bound counts them, docs/search.md); () where each has its own devices (GPUs)."""
    if rr.recipe.topology.gpus_per_node:
        return ()
    workers = plan(rr).role(role)
    keys = [w.cpu_bind if w.cpu_bind else f"worker {w.index}" for w in workers]
    return tuple(keys.index(k) for k in keys)


def targets(rr: ResolvedRecipe) -> list[Target]:
    """The recipe's deployment (xP+yD, or its aggregated servers) and its aggregated baseline."""
    t = rr.recipe.topology
    model, topology = rr.model.model_dump(), t.model_dump()
    out = []
    try:
        if not t.aggregated_only:
            d = Deployment(
                "disagg",
                t.prefill.workers,
                t.decode.workers,
                t.prefill.gpus_per_worker,
                t.decode.gpus_per_worker,
                device_groups(rr, "prefill"),
                device_groups(rr, "decode"),
                kv_polled=not rr.recipe.connector.progress_thread,
            )
            out.append(Target(d, *limits(model, topology, "disagg"), "topology.prefill/decode"))
        if t.aggregated is not None:
            d = Deployment(
                "agg", t.aggregated.workers, 0, t.aggregated.gpus_per_worker, 0, device_groups(rr, "aggregated")
            )
            out.append(Target(d, *limits(model, topology, "agg"), "topology.aggregated"))
    except LimitsError as e:
        raise PredictError(str(e)) from None
    return out


def with_limits(profile: PerfProfile, target: Target) -> PerfProfile:
    """The profile as the target's servers would run: its engine limits, not the profiled run's."""
    return profile.model_copy(
        update={"max_num_seqs": target.max_num_seqs, "max_batched_tokens": target.max_batched_tokens}
    )


@dataclass(frozen=True)
class PointPrediction:
    prediction: Prediction
    goodput_per_device: float  # input and output tokens a second, per device
    band: float  # relative half-width (harness.predict.band)


def predict_point(
    profile: PerfProfile, target: Target, concurrency: int, isl: int, osl: int, prompts: int, devices: int
) -> PointPrediction:
    """One point of a sweep predicted for the target's servers, the way every prediction before a
    run is made (`pdbench submit`'s and the search's)."""
    prof = with_limits(profile, target)
    p = predict(prof, target.deployment, concurrency, isl, osl, prompts)
    total = p.output_throughput * (isl + osl) / osl
    return PointPrediction(p, total / devices, band_of(prof, p))


def profiles_of(run: Path, store_it: bool = True) -> list[PerfProfile]:
    """A run's profiles, one per phase, fitted from its points; stored in a pdbench run directory."""
    try:
        obs = observations(run)
        engines = of_run(run)
        phases = sorted({o.phase for o in obs})
        found = [fit_profile([o for o in obs if o.phase == ph], run, engines.get(ph, DEFAULT)) for ph in phases]
    except (ObservationError, FitError, LimitsError) as e:
        raise PredictError(str(e)) from None
    if store_it and RunDir.is_run_dir(run):
        try:
            store.write(RunDir(run).perf_profile, found)
        except OSError as e:
            raise PredictError(f"{RunDir(run).perf_profile}: cannot write the profile: {e.strerror or e}") from None
    return found


@dataclass(frozen=True)
class Table:
    target: Target
    source: Path  # the run whose profile answered
    rows: list[Prediction]


def answer(rr: ResolvedRecipe, runs: Sequence[Path], concurrencies: Sequence[int] | None = None) -> list[Table]:
    if not runs:
        raise PredictError("--from: name at least one run directory to take the profiles from")
    fitted = [(run, p) for run in runs for p in profiles_of(run)]
    shapes = rr.recipe.benchmark.shape_list()
    conc = list(concurrencies or rr.recipe.benchmark.concurrency)
    tables = []
    for target in targets(rr):
        match = next(((r, p) for r, p in fitted if p.phase == target.deployment.phase), None)
        if match is None:
            have = ", ".join(sorted({p.phase for _, p in fitted}))
            raise PredictError(
                f"{target.key}: no run of {', '.join(str(r) for r in runs)} measured {target.deployment.phase} "
                f"serving (they have: {have})"
            )
        run, profile = match[0], with_limits(match[1], target)
        bench = rr.recipe.benchmark
        rows = [
            predict(profile, target.deployment, c, s.isl, s.osl, bench.num_prompts_for(c)) for s in shapes for c in conc
        ]
        tables.append(Table(target, run, rows))
    return tables


def render(tables: Sequence[Table]) -> str:
    lines = []
    for t in tables:
        d = t.target.deployment
        lines.append(
            f"{d.label} ({d.gpus} GPUs), profile from {t.source}; max_num_seqs {t.target.max_num_seqs}, "
            f"max_num_batched_tokens {t.target.max_batched_tokens}"
        )
        head = (
            f"{'isl/osl':>11} {'conc':>5} {'TTFT p50':>9} {'p90':>8} {'p99':>8} {'TPOT':>7} {'p90':>7} "
            f"{'out tok/s':>10} {'/GPU':>8}  extrapolating"
        )
        lines.append(head)
        for p in t.rows:
            per_gpu = p.output_throughput_per_gpu
            lines.append(
                f"{p.isl:>5}/{p.osl:<5} {p.concurrency:>5} {p.ttft_ms['p50']:>9.1f} {p.ttft_ms['p90']:>8.1f} "
                f"{p.ttft_ms['p99']:>8.1f} {p.tpot_ms['mean']:>7.2f} {p.tpot_ms['p90']:>7.2f} "
                f"{p.output_throughput:>10.1f} {per_gpu if per_gpu is not None else float('nan'):>8.1f}  "
                + ("; ".join(p.extrapolating) or "no")
            )
        lines.append("")
    lines.append("ms; predicted by simulation from the profiles (docs/predict.md); nothing was run.")
    return "\n".join(lines)
