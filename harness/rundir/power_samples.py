"""A node's GPU power samples (power/raw/node<N>.csv) and what its sampler used (node<N>.json).

Written by the node's sampler (harness.power.sampler), read by node 0's accounting at each
phase's end (harness.power.account). This module is the one definition of both formats.

The CSV has one row per GPU per tick: wall-clock time (epoch s, time.time(): the clock the
benchmark client stamps benchmark_start/end_time_unix with), the host, the GPU's index and
UUID, board power in W and, where the GPU keeps one, its energy counter in J (NVML's
total energy since the driver loaded; empty elsewhere). Rows are appended and flushed per
tick, so a reader sees every tick up to the last whole line.

Telemetry that could not be had is recorded as missing with its reason in the JSON record,
never as rows of zeros.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness import atomic

DEFAULT_INTERVAL_S = 0.25  # InferenceX refuses gaps over 3 s; NVML's reading updates every ~0.1 s
COLUMNS = ("timestamp_unix", "hostname", "gpu_index", "gpu_uuid", "power_w", "energy_j")

Backend = Literal["nvml", "nvidia-smi", "amd-smi"]


@dataclass(frozen=True)
class SamplerRecord:
    """What a node's sampler used, or why it has nothing (status missing). A dataclass, not a
    pydantic model: the sampler runs in the node's interpreter with the standard library alone."""

    status: Literal["sampling", "missing"]
    hostname: str
    node: int
    interval_s: float
    started_at_unix: float
    reason: str = ""  # why missing; for sampling, why this backend (the ones tried before it)
    backend: Backend | None = None
    source_metric: str | None = None  # e.g. "nvmlDeviceGetPowerUsage"
    gpus: list[str] = field(default_factory=list)  # "<index>:<uuid>" of every GPU sampled
    phase: str = ""  # the job's phase whose servers it samples with (disagg, aggregated)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_record(path: Path, rec: SamplerRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, rec.to_json(), indent=2)


@dataclass(frozen=True)
class Sample:
    timestamp_unix: float
    hostname: str
    gpu_index: int
    gpu_uuid: str
    power_w: float
    energy_j: float | None = None

    def row(self) -> list[str]:
        energy = "" if self.energy_j is None else repr(self.energy_j)
        return [
            repr(self.timestamp_unix),
            self.hostname,
            str(self.gpu_index),
            self.gpu_uuid,
            repr(self.power_w),
            energy,
        ]


def append(path: Path, samples: list[Sample]) -> None:
    """Append one tick's rows (the header first in a new file) and flush them to the file."""
    new = not path.exists() or path.stat().st_size == 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        if new:
            w.writerow(COLUMNS)
        w.writerows(s.row() for s in samples)


def read(path: Path) -> tuple[list[Sample], list[str]]:
    """Every whole, well-formed row of one node's file, and a note per row skipped (a row cut
    short by a kill mid-write, a non-finite value). A missing file reads as no rows."""
    if not path.is_file():
        return [], []
    rows: list[Sample] = []
    skipped: list[str] = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is not None and tuple(header) != COLUMNS:
            return [], [f"{path.name}: header {header} is not {list(COLUMNS)}"]
        for n, raw in enumerate(reader, start=2):
            try:
                ts, host, idx, uuid, power, energy = raw
                s = Sample(float(ts), host, int(idx), uuid, float(power), float(energy) if energy else None)
            except ValueError:
                skipped.append(f"{path.name}:{n}: malformed row {raw}")
                continue
            if not (math.isfinite(s.timestamp_unix) and math.isfinite(s.power_w) and s.power_w >= 0):
                skipped.append(f"{path.name}:{n}: non-finite or negative value {raw}")
                continue
            rows.append(s)
    return rows, skipped


def read_record(path: Path) -> SamplerRecord | None:
    """The node's record; None when there is none. A record that does not read raises ValueError
    naming the file."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        rec = SamplerRecord(**data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: not a power sampler record ({e})") from None
    if rec.status not in ("sampling", "missing"):
        raise ValueError(f"{path}: status {rec.status!r} is neither sampling nor missing")
    return rec


def last_timestamps(path: Path, tail_bytes: int = 16384) -> dict[int, float]:
    """Each GPU's latest sample time, read from the file's tail (the file grows all run long)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().decode(errors="replace").split("\n")
    except OSError:
        return {}
    out: dict[int, float] = {}
    for line in lines[1:-1]:  # the first may start mid-row, the last be cut short
        try:
            ts, _host, idx, *_ = line.split(",")
            out[int(idx)] = max(out.get(int(idx), 0.0), float(ts))
        except ValueError:
            continue
    return out
