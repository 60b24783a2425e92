"""Node 0's power accounting at a phase's end: each point's energy and cost per role
(power/points/<result>.json) and the phase's dcgm-power v1 package (power/<phase>/).

It runs after the phase's client has exited, while every node's sampler still ticks: it waits
(bounded) until each sampling node has a sample after the last point's end, so every window is
bracketed, then reads the samples once. Prices come from the run's recipe.lock.yaml
(site.gpu_hour_usd, site.kwh_usd: set by the cluster profile).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import atomic
from harness.power import package
from harness.power.energy import Gpu, PointPower, Prices, Tokens, point_power
from harness.power.sampler import CALL_TIMEOUT_S
from harness.rundir import ResultName, RunDir
from harness.rundir.power_samples import (
    DEFAULT_INTERVAL_S,
    Sample,
    SamplerRecord,
    last_timestamps,
    read,
    read_record,
)
from harness.topology import PlanFile

log = logging.getLogger(__name__)

SETTLE_S = 10.0  # at most this long for every sampler's first sample after the last window
OFF = "GPU power sampling is off (benchmark.validity.power_interval_s: 0)"
SAMPLER_START_S = 15.0  # at most this long for the samplers' first tick before the client starts


def required(lock: dict[str, Any]) -> bool:
    """benchmark.validity.require_power: a point without valid power fails the job."""
    bench = (lock.get("recipe") or {}).get("benchmark") or {}
    return bool((bench.get("validity") or {}).get("require_power"))


def interval_s(lock: dict[str, Any]) -> float:
    """benchmark.validity.power_interval_s: seconds between samples; 0: no sampler."""
    bench = (lock.get("recipe") or {}).get("benchmark") or {}
    return float((bench.get("validity") or {}).get("power_interval_s", DEFAULT_INTERVAL_S))


def _lock(run_dir: Path) -> dict[str, Any]:
    run = RunDir(run_dir)
    return run.read_lock() if run.lock.is_file() else {}


def power_required(run_dir: Path) -> bool:
    return required(_lock(run_dir))


def power_interval(run_dir: Path) -> float:
    return interval_s(_lock(run_dir))


def prices(lock: dict[str, Any]) -> Prices:
    site = (lock.get("recipe") or {}).get("site") or {}
    return Prices(site.get("gpu_hour_usd"), site.get("kwh_usd"))


def _window(result: dict[str, Any]) -> tuple[float, float] | None:
    start, end = result.get("benchmark_start_time_unix"), result.get("benchmark_end_time_unix")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (start, end))
    if not ok or not result.get("completed") or end <= start:  # type: ignore[operator]  # checked numbers
        return None
    return float(start), float(end)  # type: ignore[arg-type]


def _own(spec: str | None, devices: int) -> list[int] | None:
    """The worker's own GPUs: the first `devices` of its visible ones (colocated servers also see
    the node's other GPUs after their own, for the KV copy)."""
    return None if spec is None else [int(x) for x in spec.split(",") if x.strip()][:devices]


def phase_gpus(
    plan: PlanFile, phase: str, records: dict[int, SamplerRecord | None], samples: dict[tuple[int, int], list[Sample]]
) -> tuple[list[Gpu], list[str]]:
    """The phase's GPUs with their servers and roles, and why any could not be placed: a worker
    with visible_devices uses its own of them on each of its nodes, one without owns its nodes'
    GPUs (every GPU sampled there)."""
    gpus: list[Gpu] = []
    problems: list[str] = []
    for w in plan.workers:
        if w.phase != phase:
            continue
        for node in w.nodes:
            rec = records.get(node)
            if rec is None or rec.status != "sampling":
                why = "no sampler record" if rec is None else f"telemetry missing: {rec.reason}"
                problems.append(f"node {node} ({w.name}): {why}")
                continue
            indices = _own(w.visible_devices, w.devices)
            if indices is None:
                indices = sorted({i for n, i in samples if n == node})
            for i in indices:
                uuid = next((s.gpu_uuid for s in samples.get((node, i), [])), "")
                gpus.append(Gpu(node, rec.hostname, i, uuid, w.name, w.role))
    return gpus, problems


def wait_for_samplers(run_dir: Path, nodes: Sequence[int], phase: str, timeout_s: float = SAMPLER_START_S) -> list[int]:
    """Wait (bounded) until every node's sampler of this phase (not an earlier phase's) has
    recorded what it samples (its first tick made) or that it has nothing, so the first point's
    window has samples before it; returns the nodes that did not in time."""
    run = RunDir(run_dir)
    deadline = time.monotonic() + timeout_s

    def recorded(node: int) -> bool:
        try:
            rec = read_record(run.power_record(node))
        except ValueError:
            return False
        return rec is not None and rec.phase == phase

    pending = list(nodes)
    while pending:
        pending = [n for n in pending if not recorded(n)]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return pending


def _wait_for_samples(run: RunDir, nodes: Sequence[int], after: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(nodes)
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending if min(last_timestamps(run.power_samples(n)).values(), default=0.0) < after]
        if pending:
            time.sleep(0.2)
    if pending:
        log.warning("power: no sample after the last window from node(s) %s within %.0f s", pending, timeout_s)


def account(
    run_dir: Path,
    plan: PlanFile,
    phase: str,
    results: Sequence[Path],
    started_at: float,
    into: RunDir | None = None,
) -> list[PointPower]:
    """Write every point's energy and cost, and the phase's package; returns the points' records.
    The samples are the run's; `into` (a workload's folder, laid out as the run) gets the records."""
    run = RunDir(run_dir)
    out_dir = into or run
    lock = _lock(run_dir)
    phase_nodes = sorted({n for w in plan.workers if w.phase == phase for n in w.nodes})
    records = {n: read_record(run.power_record(n)) for n in phase_nodes}
    sampling = [n for n, r in records.items() if r is not None and r.status == "sampling"]
    loaded = [(f, json.loads(f.read_text())) for f in results]
    windows = {f.name: _window(r) for f, r in loaded}
    ends = [w[1] for w in windows.values() if w is not None]
    if sampling and ends:
        interval = max(r.interval_s for r in records.values() if r is not None)
        _wait_for_samples(run, sampling, max(ends), min(SETTLE_S, 4 * interval + CALL_TIMEOUT_S))
    samples: dict[tuple[int, int], list[Sample]] = {}
    for n in sampling:
        rows, skipped = read(run.power_samples(n))
        for note in skipped:
            log.warning("power: %s", note)
        for s in rows:
            samples.setdefault((n, s.gpu_index), []).append(s)
    gpus, problems = phase_gpus(plan, phase, records, samples)
    missing = None
    if not interval_s(lock):
        missing, problems = OFF, []
    elif not sampling:
        missing = "; ".join(problems) or "no node of this phase ran a power sampler"
    role_gpus: dict[str, int] = {}
    for w in plan.workers:
        if w.phase == phase:
            role_gpus[w.role] = role_gpus.get(w.role, 0) + w.devices  # tp x dp, over all its nodes
    price = prices(lock)
    out: list[PointPower] = []
    for f, r in loaded:
        p = point_power(
            f.name,
            phase,
            windows[f.name],
            Tokens(
                int(r.get("completed") or 0),
                int(r.get("total_input_tokens") or 0),
                int(r.get("total_output_tokens") or 0),
            ),
            gpus,
            samples,
            price,
            missing=missing,
            role_gpus=role_gpus,
        )
        if missing is None and problems:
            p.reasons[:0] = problems
            p.power_valid, p.total, p.roles, p.servers = False, None, {}, {}
        out_dir.power_point(f.name).parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out_dir.power_point(f.name), p.model_dump_json(indent=2) + "\n")
        out.append(p)
    if sampling:
        _write_package(out_dir, lock, plan, phase, gpus, records, samples, loaded, started_at)
    return out


def _write_package(
    run: RunDir,
    lock: dict[str, Any],
    plan: PlanFile,
    phase: str,
    gpus: list[Gpu],
    records: dict[int, SamplerRecord | None],
    samples: dict[tuple[int, int], list[Sample]],
    loaded: list[tuple[Path, dict[str, Any]]],
    started_at: float,
) -> None:
    live = {n: r for n, r in records.items() if r is not None and r.status == "sampling"}
    names = [r.hostname for r in live.values()]
    # Two nodes of one host (the local launcher) stay two in the package: each samples the same GPUs.
    hostnames = {n: r.hostname if names.count(r.hostname) == 1 else f"{r.hostname}-node{n}" for n, r in live.items()}
    windows: list[package.Window] = []
    seen: set[tuple[str, int]] = set()
    for f, r in loaded:
        name = ResultName.parse(f.name)
        if _window(r) is None or r.get("stop_reason") or name is None:
            continue  # only whole points: a cut-short one has no completed window
        kind = phase if name.shape is None else f"{phase}-{name.shape}"
        if (kind, name.concurrency) in seen:
            log.warning(
                "power: a second %s point at concurrency %d has no window of its own in the package",
                kind,
                name.concurrency,
            )
            continue
        seen.add((kind, name.concurrency))
        windows.append(
            package.Window(
                run.relative(f),
                kind,
                name.concurrency,
                r["benchmark_start_time_unix"],
                r["benchmark_end_time_unix"],
                r["duration"],
            )
        )
    backends = sorted({r.backend for r in live.values() if r.backend})
    package.write(
        run.power_package(phase),
        gpus=gpus,  # every GPU of the plan: one without samples fails the package, as it should
        hostnames=hostnames,
        samples=samples,
        windows=windows,
        backend="+".join(backends),
        interval_s=max(r.interval_s for r in live.values()),
        request_timeout_s=CALL_TIMEOUT_S,
        started_at=started_at,
        stopped_at=time.time(),
        producer_commit=lock.get("git_commit"),
        samplers=[r.to_json() for r in live.values()],
        required=required(lock),
    )
