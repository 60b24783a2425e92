"""One point's GPU energy and cost per role, from the samples of its GPUs over its measured window.

Semantics are InferenceX's (utils/aggregate_power*.py at 843c6254): each GPU's board power is
integrated over the point's window [benchmark_start_time_unix, benchmark_end_time_unix] by the
trapezoid rule with the power interpolated linearly at both ends, so the window must be
bracketed by a sample on each side; a role's energy is the sum over its GPUs (board energy of
the role's GPUs over the whole window, not a kernel-level prefill or decode energy). Its mean
power is that energy over the window and its GPUs; J per input token is prefill's energy over
the point's input tokens, J per output token decode's over its output tokens; the whole
deployment's figures divide all GPUs' energy. A gap between samples wider than
MAX_SAMPLE_GAP_S inside the window makes the point's power invalid, with the reason.

Cost: the GPUs' time at the cluster's price per GPU-hour plus, where a price per kWh is given,
the energy at it; dollars per million tokens divide that by the point's tokens.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import Field

from harness.rundir.power_samples import Sample
from harness.strict import Strict

MAX_SAMPLE_GAP_S = 3.0  # InferenceX's (srt-slurm contract.MAX_SAMPLE_GAP_SECONDS)
J_PER_KWH = 3.6e6


class NotBracketed(ValueError):
    pass


@dataclass(frozen=True)
class Gpu:
    """One GPU of a phase: where it is and which server (and role) uses it."""

    node: int
    hostname: str
    index: int
    uuid: str
    server: str  # the worker, e.g. prefill-0
    role: str  # prefill, decode, aggregated

    @property
    def label(self) -> str:
        return f"{self.hostname}/gpu{self.index}"


@dataclass(frozen=True)
class Prices:
    gpu_hour_usd: float | None = None
    kwh_usd: float | None = None


def _at(samples: Sequence[tuple[float, float]], t: float) -> float:
    times = [s[0] for s in samples]
    right = bisect.bisect_left(times, t)
    if right < len(samples) and samples[right][0] == t:
        return samples[right][1]
    if right == 0 or right >= len(samples):
        raise NotBracketed(f"no sample on both sides of {t:.3f}")
    (t0, v0), (t1, v1) = samples[right - 1], samples[right]
    return v0 + (t - t0) / (t1 - t0) * (v1 - v0)


def integrate(samples: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """∫ over [start, end] of the piecewise-linear curve through `samples` (sorted by time)."""
    pts = [(start, _at(samples, start)), *((t, v) for t, v in samples if start < t < end), (end, _at(samples, end))]
    return sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in itertools.pairwise(pts))


def largest_gap(times: Sequence[float], start: float, end: float) -> float | None:
    """The widest step between the last sample at or before `start`, those inside, and the first
    at or after `end`; None when the window is not bracketed."""
    before = [t for t in times if t <= start]
    after = [t for t in times if t >= end]
    if not before or not after:
        return None
    seq = [before[-1], *(t for t in times if start < t < end), after[0]]
    return max((b - a for a, b in itertools.pairwise(seq)), default=0.0)


class GroupPower(Strict):
    """A role's or a server's GPUs over the window."""

    gpus: int
    energy_j: float
    mean_w: float  # per GPU: energy / window / GPUs
    peak_w: float  # the highest reading of any one of its GPUs inside the window
    counter_energy_j: float | None = None  # the GPUs' own energy counters over the window (NVML)
    j_per_input_token: float | None = None  # prefill
    j_per_output_token: float | None = None  # decode
    j_per_request: float | None = None


class Cost(Strict):
    gpu_hour_usd: float | None = None
    kwh_usd: float | None = None
    gpus: int
    gpu_time_usd: float | None = None
    energy_usd: float | None = None
    usd: float | None = None  # None: a price is given whose quantity is missing (energy)
    usd_per_mtok_input: float | None = None  # whole deployment over input tokens
    usd_per_mtok_output: float | None = None  # whole deployment over output tokens
    usd_per_mtok_total: float | None = None
    prefill_usd_per_mtok_input: float | None = None  # prefill's GPUs over input tokens
    decode_usd_per_mtok_output: float | None = None  # decode's GPUs over output tokens
    note: str = ""


class PointPower(Strict):
    """power/points/<result file>: one point's energy and cost (harness.rundir RunDir.power_point)."""

    result: str
    phase: str
    start_unix: float | None = None
    end_unix: float | None = None
    duration_s: float | None = None
    # True: every GPU bracketed, no gap over the bound; False: reasons say why; None: no telemetry
    # at all (missing, with its reason), never read as zero.
    power_valid: bool | None
    reasons: list[str] = Field(default_factory=list)
    missing: str | None = None
    total: GroupPower | None = None
    j_per_total_token: float | None = None
    roles: dict[str, GroupPower] = Field(default_factory=dict)
    servers: dict[str, GroupPower] = Field(default_factory=dict)
    max_sample_gap_s: dict[str, float] = Field(default_factory=dict)
    # A GPU that servers of several roles use (two instances on one GPU) -> those servers. Each
    # role's energy counts it whole (its GPUs' board energy), so the roles' energies overlap and do
    # not add up to the total, which counts every physical GPU once, as the GPU-time cost does.
    shared_gpus: dict[str, list[str]] = Field(default_factory=dict)
    cost: Cost | None = None


@dataclass(frozen=True)
class Tokens:
    completed: int
    input: int
    output: int


def _physical(g: Gpu) -> str:
    """One physical GPU, however many servers (and local-launcher nodes) use and sample it."""
    return g.uuid or f"{g.hostname}/gpu{g.index}"


def _distinct(gpus: Sequence[Gpu]) -> list[Gpu]:
    """Each physical GPU once: the first of the entries naming it (their samples are the same
    GPU's, read by each node that samples it)."""
    first: dict[str, Gpu] = {}
    for g in gpus:
        first.setdefault(_physical(g), g)
    return list(first.values())


def _shared(gpus: Sequence[Gpu]) -> dict[str, list[str]]:
    roles: dict[str, set[str]] = {}
    servers: dict[str, list[str]] = {}
    labels: dict[str, str] = {}
    for g in gpus:
        key = _physical(g)
        roles.setdefault(key, set()).add(g.role)
        servers.setdefault(key, []).append(g.server)
        labels.setdefault(key, g.label)
    return {labels[k]: list(dict.fromkeys(servers[k])) for k in servers if len(roles[k]) > 1}


def _group(
    gpus: Sequence[Gpu],
    energy: Mapping[Gpu, float],
    peaks: Mapping[Gpu, float],
    counters: Mapping[Gpu, float | None],
    duration: float,
    completed: int,
) -> GroupPower:
    e = sum(energy[g] for g in gpus)
    counted = [counters[g] for g in gpus]
    return GroupPower(
        gpus=len(gpus),
        energy_j=e,
        mean_w=e / duration / len(gpus),
        peak_w=max(peaks[g] for g in gpus),
        counter_energy_j=None if any(c is None for c in counted) else sum(c for c in counted if c is not None),
        j_per_request=e / completed if completed else None,
    )


def _counter(rows: Sequence[Sample], start: float, end: float) -> float | None:
    pts = [(s.timestamp_unix, s.energy_j) for s in rows if s.energy_j is not None]
    if len(pts) != len(rows) or not pts:
        return None
    try:
        return _at(pts, end) - _at(pts, start)
    except NotBracketed:
        return None


def point_power(
    result: str,
    phase: str,
    window: tuple[float, float] | None,
    tokens: Tokens,
    gpus: Sequence[Gpu],
    samples: Mapping[tuple[int, int], Sequence[Sample]],
    prices: Prices,
    missing: str | None = None,
    role_gpus: Mapping[str, int] | None = None,
) -> PointPower:
    """The point's figures. `samples` is keyed by (node, gpu index); `missing` says why there
    is no telemetry at all; `role_gpus` the GPUs per role the price counts (the plan's; default:
    those of `gpus`), so a point without telemetry still has its GPU-time cost."""
    out = PointPower(result=result, phase=phase, power_valid=None, missing=missing)
    if window is None:
        out.reasons.append("the point has no measured window (no request completed)")
        out.power_valid = False if missing is None else None
        counts = dict(role_gpus) if role_gpus is not None else _role_gpus(gpus)
        out.cost = cost(out, tokens, prices, sum(counts.values()), counts)
        return out
    start, end = window
    duration = end - start
    out.start_unix, out.end_unix, out.duration_s = start, end, duration
    if duration <= 0:
        out.power_valid = False
        out.reasons.append(f"the window is empty ({duration} s)")
    energy: dict[Gpu, float] = {}
    peaks: dict[Gpu, float] = {}
    counters: dict[Gpu, float | None] = {}
    if missing is None and out.power_valid is None:
        if not gpus:
            out.reasons.append("no GPU of this phase was sampled")
        for g in gpus:
            rows = sorted(samples.get((g.node, g.index), ()), key=lambda s: s.timestamp_unix)
            if not rows:
                out.reasons.append(f"{g.label} ({g.server}): no samples")
                continue
            if len({s.gpu_uuid for s in rows}) != 1:
                out.reasons.append(f"{g.label}: its UUID changed between samples")
                continue
            gap = largest_gap([s.timestamp_unix for s in rows], start, end)
            if gap is None:
                out.reasons.append(f"{g.label} ({g.server}): the window is not bracketed by samples")
                continue
            out.max_sample_gap_s[g.label] = gap
            if gap > MAX_SAMPLE_GAP_S:
                out.reasons.append(
                    f"{g.label} ({g.server}): a {gap:.2f} s gap between samples (bound {MAX_SAMPLE_GAP_S} s)"
                )
                continue
            pts = [(s.timestamp_unix, s.power_w) for s in rows]
            energy[g] = integrate(pts, start, end)
            inside = [w for t, w in pts if start <= t <= end]
            peaks[g] = max(inside or [_at(pts, start), _at(pts, end)])
            counters[g] = _counter(rows, start, end)
        out.power_valid = not out.reasons
    if out.power_valid:
        out.shared_gpus = _shared(gpus)
        out.total = _group(_distinct(gpus), energy, peaks, counters, duration, tokens.completed)
        if tokens.input:
            out.total.j_per_input_token = out.total.energy_j / tokens.input
        if tokens.output:
            out.total.j_per_output_token = out.total.energy_j / tokens.output
        if tokens.input + tokens.output:
            out.j_per_total_token = out.total.energy_j / (tokens.input + tokens.output)
        for role in dict.fromkeys(g.role for g in gpus):
            mine = _distinct([g for g in gpus if g.role == role])
            grp = _group(mine, energy, peaks, counters, duration, tokens.completed)
            if role == "prefill" and tokens.input:
                grp.j_per_input_token = grp.energy_j / tokens.input
            if role == "decode" and tokens.output:
                grp.j_per_output_token = grp.energy_j / tokens.output
            out.roles[role] = grp
        for server in dict.fromkeys(g.server for g in gpus):
            out.servers[server] = _group(
                _distinct([g for g in gpus if g.server == server]), energy, peaks, counters, duration, tokens.completed
            )
    counts = dict(role_gpus) if role_gpus is not None else _role_gpus(gpus)
    # The GPU-time of the whole is its physical GPUs': two roles' servers on one GPU pay for one.
    whole = len({_physical(g) for g in gpus}) if gpus else sum(counts.values())
    out.cost = cost(out, tokens, prices, whole, counts)
    return out


def _role_gpus(gpus: Sequence[Gpu]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.role] = counts.get(g.role, 0) + 1
    return counts


def _per_mtok(usd: float | None, tokens: int) -> float | None:
    return usd / tokens * 1e6 if usd is not None and tokens else None


def cost(p: PointPower, tokens: Tokens, prices: Prices, gpus: int, role_gpus: Mapping[str, int]) -> Cost | None:
    """The point's dollars, or None where no price is given."""
    if prices.gpu_hour_usd is None and prices.kwh_usd is None:
        return None
    c = Cost(gpu_hour_usd=prices.gpu_hour_usd, kwh_usd=prices.kwh_usd, gpus=gpus)
    if p.duration_s is None:
        c.note = "no measured window"
        return c
    hours = p.duration_s / 3600

    def role_usd(role: str) -> float | None:
        grp = p.roles.get(role)
        n = role_gpus.get(role, 0)
        if not n:
            return None
        parts: list[float | None] = []
        if prices.gpu_hour_usd is not None:
            parts.append(prices.gpu_hour_usd * n * hours)
        if prices.kwh_usd is not None:
            parts.append(prices.kwh_usd * grp.energy_j / J_PER_KWH if grp is not None else None)
        return None if any(x is None for x in parts) else sum(x for x in parts if x is not None)

    if prices.gpu_hour_usd is not None:
        c.gpu_time_usd = prices.gpu_hour_usd * gpus * hours
    if prices.kwh_usd is not None and p.total is not None:
        c.energy_usd = prices.kwh_usd * p.total.energy_j / J_PER_KWH
    if prices.kwh_usd is not None and p.total is None:
        c.note = "a price per kWh is given and the energy is missing or invalid: no total"
    else:
        c.usd = (c.gpu_time_usd or 0.0) + (c.energy_usd or 0.0)
    c.usd_per_mtok_input = _per_mtok(c.usd, tokens.input)
    c.usd_per_mtok_output = _per_mtok(c.usd, tokens.output)
    c.usd_per_mtok_total = _per_mtok(c.usd, tokens.input + tokens.output)
    c.prefill_usd_per_mtok_input = _per_mtok(role_usd("prefill"), tokens.input)
    c.decode_usd_per_mtok_output = _per_mtok(role_usd("decode"), tokens.output)
    return c
