"""One phase's samples and windows as the dcgm-power v1 package (power/<phase>/): manifest.json,
samples.csv, windows/<result stem>.json, the layout srt-slurm produces and InferenceX's
utils/aggregate_power_multinode.py (843c6254) re-validates before it patches role energy into
its aggregate.

What is pdbench's own and says so, so InferenceX refuses it as it is (tests/power/test_power_contract.py
runs its validator and names each refusal): `producer` is pdbench.power, not srt-slurm.dcgm-power,
and `producer_git_commit` pdbench's commit (InferenceX requires its srt-slurm pin);
`source_metric`/`power_scope` name NVML's or the SMI's reading, not DCGM's (the same board power,
read without a DCGM exporter, so `dcgm_exporter` is null); with more than one node the clock is
each node's own (`node_unix_clock`, NTP-synchronised), not the head node's. Everything else
follows the v1 contract and is checked by InferenceX's own code in that test: the sample rows,
the observed devices, the windows bound to the result files by content, and the per-window
audit, whose stored copy InferenceX recomputes and compares.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import atomic
from harness.power.energy import MAX_SAMPLE_GAP_S, Gpu, largest_gap
from harness.rundir.power_samples import Sample

SCHEMA_VERSION = 1
PRODUCER = "pdbench.power"
UNIT = "W"
HEAD_CLOCK = "head_node_unix_clock"  # the client's windows are stamped on the head node
NODE_CLOCK = "node_unix_clock"
SAMPLES_HEADER = ("schema_version", "timestamp_unix", "scrape_seq", "hostname", "gpu_index", "gpu_uuid", "power_w")
ROLE = {"prefill": "prefill", "decode": "decode", "aggregated": "agg"}  # the contract's worker_role
CLOCK_TOLERANCE_S, CLOCK_TOLERANCE_FRACTION = 0.5, 0.01
SCOPES = {
    "nvml": "gpu_device_board_as_reported_by_nvml",
    "nvidia-smi": "gpu_device_board_as_reported_by_nvidia_smi",
    "amd-smi": "gpu_socket_as_reported_by_amd_smi",
}


@dataclass(frozen=True)
class Window:
    """A completed point: its result file (relative to the run directory) and its result's keys."""

    result_path: str
    benchmark_type: str
    concurrency: int
    start: float
    end: float
    duration: float


def _dedupe(xs: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(xs))


def _window_audit(
    w: Window,
    devices: Sequence[tuple[str, int]],
    times: Mapping[tuple[str, int], list[float]],
    uuids: Mapping[tuple[str, int], list[str]],
) -> dict[str, Any]:
    """One expected window's row of window_validations, as the contract computes it."""
    reasons: list[str] = []
    tolerance = max(CLOCK_TOLERANCE_S, CLOCK_TOLERANCE_FRACTION * w.duration)
    if abs((w.end - w.start) - w.duration) > tolerance:
        reasons.append("measurement_window_clock_mismatch")
    gaps: dict[str, float] = {}
    if not reasons:
        for key in sorted(devices):
            if key not in times:
                reasons.append("measurement_window_not_bracketed")
                continue
            if len(uuids[key]) != 1:
                reasons.append("gpu_uuid_changed")
                continue
            gap = largest_gap(times[key], w.start, w.end)
            if gap is None:
                reasons.append("measurement_window_not_bracketed")
                continue
            gaps[f"{key[0]}/{uuids[key][0]}"] = gap
            if gap > MAX_SAMPLE_GAP_S:
                reasons.append("sample_gap_exceeded")
        if reasons:
            gaps = {}
    return {
        "benchmark_type": w.benchmark_type,
        "concurrency": w.concurrency,
        "window_file": f"windows/{Path(w.result_path).stem}.json",
        "power_coverage_valid": not reasons,
        "reason_codes": _dedupe(reasons),
        "per_device_max_sample_gap_seconds": gaps,
    }


def write(
    out: Path,
    *,
    gpus: Sequence[Gpu],
    hostnames: Mapping[int, str],
    samples: Mapping[tuple[int, int], Sequence[Sample]],
    windows: Sequence[Window],
    backend: str,
    interval_s: float,
    request_timeout_s: float,
    started_at: float,
    stopped_at: float,
    producer_commit: str | None,
    samplers: list[dict[str, Any]],
    required: bool = False,
) -> dict[str, Any]:
    """Write the package into `out` (replacing its files) and return the manifest. `hostnames`
    names each node in the package (unique per node); `samples` is keyed by (node, gpu index)."""
    rows: list[tuple[str, int, str, float, float]] = []  # host, index, uuid, t, W
    for g in gpus:
        last = None
        for s in sorted(samples.get((g.node, g.index), ()), key=lambda s: s.timestamp_unix):
            if last is not None and s.timestamp_unix <= last:
                continue  # the contract wants strictly increasing times per device
            rows.append((hostnames[g.node], g.index, s.gpu_uuid, s.timestamp_unix, s.power_w))
            last = s.timestamp_unix
    rows.sort(key=lambda r: (r[0], r[1], r[3]))
    buf = io.StringIO()
    wr = csv.writer(buf, lineterminator="\n")
    wr.writerow(SAMPLES_HEADER)
    times: dict[tuple[str, int], list[float]] = {}
    uuids: dict[tuple[str, int], list[str]] = {}
    for key, group in itertools.groupby(rows, key=lambda r: (r[0], r[1])):
        for seq, (host, idx, uuid, t, watts) in enumerate(group):
            wr.writerow([SCHEMA_VERSION, repr(t), seq, host, idx, uuid, repr(watts)])
            times.setdefault(key, []).append(t)
            if uuid not in uuids.setdefault(key, []):
                uuids[key].append(uuid)
    scrape_count = max((len(v) for v in times.values()), default=0)

    expected_devices = [
        {
            "hostname": hostnames[g.node],
            "gpu_index": g.index,
            "assignments": [
                {
                    "worker_role": ROLE[g.role],
                    "worker_index": int(g.server.rsplit("-", 1)[1]),
                    "worker_process": 0,
                    "het_group": None,
                }
            ],
        }
        for g in gpus
    ]
    device_keys = [(hostnames[g.node], g.index) for g in gpus]
    observed = [
        {
            "hostname": key[0],
            "gpu_index": key[1],
            "gpu_uuids": uuids[key],
            "first_sample_time_unix": min(times[key]),
            "last_sample_time_unix": max(times[key]),
        }
        for key in sorted(times)
    ]
    validations = [_window_audit(w, device_keys, times, uuids) for w in windows]
    devices_ok = (
        bool(device_keys)
        and set(device_keys) == set(times)
        and all(len(u) == 1 for u in uuids.values())
        and len({u[0] for u in uuids.values()}) == len(uuids)
    )
    one_host = len(set(hostnames.values())) <= 1
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "producer": PRODUCER,
        "producer_git_commit": producer_commit,
        "source_metric": backend,
        "unit": UNIT,
        "power_scope": SCOPES.get(backend, backend),
        "timestamp_source": HEAD_CLOCK if one_host else NODE_CLOCK,
        "status": "complete",
        "started_at_unix": started_at,
        "stopped_at_unix": stopped_at,
        "sample_interval_seconds": interval_s,
        "request_timeout_seconds": request_timeout_s,
        "scrape_count": scrape_count,
        "sample_row_count": len(rows),
        "required": required,
        "reason_codes": [],
        "dcgm_exporter": None,
        "samplers": samplers,
        "expected_devices": expected_devices,
        "expected_windows": [{"benchmark_type": w.benchmark_type, "concurrency": w.concurrency} for w in windows],
        "observed_devices": observed,
        "window_validations": validations,
        "artifact_errors": [],
        "publication_valid": devices_ok and bool(windows) and all(v["power_coverage_valid"] for v in validations),
    }
    (out / "windows").mkdir(parents=True, exist_ok=True)
    for stale in (out / "windows").glob("*.json"):
        stale.unlink()
    for w in windows:
        atomic.write_json(
            out / "windows" / f"{Path(w.result_path).stem}.json",
            {
                "schema_version": SCHEMA_VERSION,
                "clock_source": HEAD_CLOCK,
                "status": "completed",
                "benchmark_type": w.benchmark_type,
                "concurrency": w.concurrency,
                "result_path": w.result_path,
                "benchmark_start_time_unix": w.start,
                "benchmark_end_time_unix": w.end,
                "duration": w.duration,
                "reason": None,
            },
            indent=2,
        )
    atomic.write_text(out / "samples.csv", buf.getvalue())
    atomic.write_json(out / "manifest.json", manifest, indent=2)
    return manifest
