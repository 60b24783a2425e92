"""The report's input model: what was read from the result files of every run, and what was not.

`load` fills it; everything above reads it. A point keeps its file's latencies under their own
keys (in ms), so the table and `collect` take what they need without re-reading the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.rundir.accuracy_summary import AccuracySummary
from harness.rundir.bottleneck_summary import BottleneckSummary
from harness.rundir.kv_handoff_summary import KvHandoffSummary
from harness.rundir.prefix_cache_summary import PrefixCacheSummary
from harness.rundir.profile_summary import ProfileSummary
from harness.rundir.schedule_summary import ScheduleSummary
from harness.rundir.sentinel_summary import SentinelSummary
from harness.rundir.session_summary import SessionSummary


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


@dataclass(frozen=True)
class Note:
    """Something a reader should know about a file that was used (or a run argument)."""

    path: Path
    text: str
    warning: bool = False  # a field of the file is not what it should be: also said on stderr


@dataclass
class Point:
    """One sweep point, whatever client wrote it. Latencies stay in ms under their file keys."""

    path: Path
    source: str  # pdbench | vllm | inferencex | srt-slurm
    concurrency: int
    request_rate: str | None
    isl: int | None
    osl: int | None
    model: str | None
    completed: int | None
    failed: int | None
    failed_derived: bool  # failed = num_prompts - completed (files without a `failed` key)
    requests: int | None  # sent: completed + failed, else num_prompts; None when neither is known
    total_token_throughput: float
    output_throughput: float
    prefill_gpus: int | None
    decode_gpus: int | None
    gpus_from: str | None
    ms: dict[str, float]  # every numeric key ending in "ms", in file order, aliases resolved
    metadata: dict[str, Any]
    valid: bool | None  # True / False for a valid / invalid verdict; None otherwise
    validity_reasons: list[str]  # why the verdict is not "valid"
    fingerprint: str | None
    stop_reason: str | None = None  # pdbench: why the point ended before every request was done
    not_sent: int | None = None  # pdbench: the requests that stop kept from being sent
    # "valid" | "invalid" | "unverified" (a pdbench point without evidence); None: another
    # tool's file, which has no notion of validity.
    verdict: str | None = None
    ttft_breakdown: dict[str, Any] | None = None  # pdbench: where the point's TTFT went
    sentinels: SentinelSummary | None = None  # pdbench: its outputs checked against a reference
    outputs_match: str | None = None  # the outputs_match rule's status, when recorded
    started: float | None = None  # when the point began (unix s): the sweep's order
    sessions: SessionSummary | None = None  # pdbench: a multi-turn point, turn by turn
    schedule: ScheduleSummary | None = None  # pdbench: a trace replay's timing against the trace
    prefix_cache: PrefixCacheSummary | None = None  # pdbench: what each role's prefix cache found
    client: dict[str, Any] | None = None  # pdbench: its own load (cpu_busy, loop_lag_ms, warnings)
    bottleneck: BottleneckSummary | None = None  # pdbench: what limits the point, with its evidence
    profile: ProfileSummary | None = None  # pdbench: a profiled point's traces and the profiler's cost
    kv_handoff: KvHandoffSummary | None = None  # pdbench: how the point's KV moved, per the connector


@dataclass
class Run:
    path: Path
    label: str
    status: dict[str, Any] | None
    is_pdbench_run: bool
    points: list[Point] = field(default_factory=list)
    accuracy: list[AccuracySummary] = field(default_factory=list)  # sorted by file name


@dataclass
class Loaded:
    runs: list[Run]
    skipped: list[Skipped]
    notes: list[Note]


def serving(p: Point) -> str:
    """ "agg" for an aggregated point (metadata.disagg false: a baseline), else "disagg"."""
    return "agg" if p.metadata.get("disagg") is False else "disagg"


def dedupe_key(run: Run, p: Point) -> tuple[Any, ...]:
    """The point identity of `collect` and of a report row: run, recipe fingerprint, serving kind
    (a run holds a disaggregated sweep and its aggregated baseline), ISL, OSL, conc."""
    return (str(run.path.resolve()), p.fingerprint, serving(p), p.isl, p.osl, p.concurrency)
