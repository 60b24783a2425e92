"""The report's data: the table's metrics and columns, the Report that compute fills and the
output modules format, and the disaggregated-vs-aggregated decision per ISL/OSL shape."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.report.points import Run, Skipped


@dataclass(frozen=True)
class Metric:
    column: str
    header: str
    better: int  # +1: higher is better, -1: lower is better
    kind: str  # "tput", "ms", "count"


METRICS: tuple[Metric, ...] = (
    Metric("tput_per_gpu", "Total tok/s/GPU", +1, "tput"),
    Metric("output_tput_per_gpu", "Output tok/s/decode GPU", +1, "tput"),
    Metric("input_tput_per_gpu", "Input tok/s/prefill GPU", +1, "tput"),
    # Absolute: what the tables show when a point's GPU split, so its per-GPU figures, is unknown.
    Metric("total_tput", "Total tok/s", +1, "tput"),
    Metric("output_tput", "Output tok/s", +1, "tput"),
    Metric("median_ttft_ms", "TTFT p50 (ms)", -1, "ms"),
    Metric("p90_ttft_ms", "TTFT p90 (ms)", -1, "ms"),
    Metric("p99_ttft_ms", "TTFT p99 (ms)", -1, "ms"),
    Metric("p99.9_ttft_ms", "TTFT p99.9 (ms)", -1, "ms"),
    Metric("median_tpot_ms", "TPOT p50 (ms)", -1, "ms"),
    Metric("p90_tpot_ms", "TPOT p90 (ms)", -1, "ms"),
    Metric("p99_tpot_ms", "TPOT p99 (ms)", -1, "ms"),
    Metric("median_itl_ms", "ITL p50 (ms)", -1, "ms"),
    Metric("p90_itl_ms", "ITL p90 (ms)", -1, "ms"),
    Metric("p99_itl_ms", "ITL p99 (ms)", -1, "ms"),
    Metric("intvty", "Interactivity (tok/s/user)", +1, "tput"),
    Metric("median_e2el_ms", "E2EL p50 (ms)", -1, "ms"),
    Metric("p99_e2el_ms", "E2EL p99 (ms)", -1, "ms"),
    Metric("failed", "Failed", -1, "count"),
)

ID_COLUMNS = (
    "run",
    "serving",  # disagg, or agg (an aggregated baseline's point)
    "baseline",
    "isl",
    "osl",
    "conc",
    "requests",  # sent: completed + failed
    "prefill_gpus",
    "decode_gpus",
    "valid",
    "verdict",
    "validity_reasons",
    "source",
    "file",
)

# Present only when a point checked its outputs (older results render as before): the sentinel
# match as text (`3/4 (first divergence at token 17)`) and its rate, matched / compared.
OUTPUT_COLUMNS = ("outputs", "outputs_match_rate")

# Present only when a point has a TTFT breakdown: the requests it covers and each part's median (ms).
BREAKDOWN_COLUMNS = (
    "ttft_breakdown_requests",
    "ttft_proxy_ms",
    "ttft_prefill_ms",
    "ttft_kv_transfer_ms",
    "ttft_decode_ms",
    "ttft_client_ms",
)
ABSOLUTE = frozenset({"total_tput", "output_tput"})
# Percentiles a client writes only when asked (`vllm bench serve --metric-percentiles`): the
# human-readable tables show them only where some point's result has them.
OPTIONAL = frozenset({"p90_ttft_ms", "p90_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms"})


@dataclass
class FrontPoint:
    x: float
    y: float  # throughput per GPU
    run: str
    conc: int


@dataclass
class ShapeDecision:
    """Does disaggregation pay at one ISL/OSL shape (see harness.report.decide)."""

    isl: int
    osl: int
    fronts: dict[str, list[FrontPoint]]  # kind -> front over interactivity, by x
    ttft_fronts: dict[str, list[FrontPoint]]  # kind -> front over TTFT p99 (x in ms), by x
    points: dict[str, list[FrontPoint]]  # kind -> every valid point (x interactivity)
    at_interactivity: list[tuple[float, float, float, float]]  # (tok/s/user, disagg, agg, ratio)
    at_concurrency: list[tuple[int, float, float, float]]  # (conc, disagg, agg, ratio)
    best: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # "any"/"disagg"/"agg" -> row

    @property
    def tag(self) -> str:
        return f"isl_{self.isl}_osl_{self.osl}"


@dataclass(frozen=True)
class DriftStep:
    """One point's sentinel match, in the order the sweep ran the points."""

    conc: int
    isl: int | None
    osl: int | None
    matched: int
    compared: int  # answered, and the reference answered them too: the rate's denominator
    answered: int
    sent: int
    match_rate: float | None


@dataclass(frozen=True)
class Drift:
    """A run's sentinel match rate point by point in sweep order (one per serving kind)."""

    run: str
    serving: str  # disagg | agg
    steps: tuple[DriftStep, ...]
    # The largest fall from an earlier point's rate to a later one's (earlier, later); None: none fell.
    fall: tuple[DriftStep, DriftStep] | None


@dataclass(frozen=True)
class Comparison:
    """A score against another of the same task: diff = score - other, with its 95 % interval."""

    other: float
    other_stderr: float | None
    diff: float
    low: float | None  # None when either stderr is unknown
    high: float | None


@dataclass(frozen=True)
class AccuracyRow:
    run: str
    phase: str  # disagg | aggregated
    when: str  # before | after
    concurrency: int
    task: str
    metric: str
    score: float | None
    stderr: float | None
    threshold: float | None
    passed: bool | None
    samples: int | None
    versus_aggregated: Comparison | None = None  # a disaggregated score against the baseline's
    versus_before: Comparison | None = None  # an after-sweep score against the before-sweep one


@dataclass(frozen=True)
class SectionTable:
    """A table of the runs' workload sections (sessions by turn, trace timing, prefix cache,
    the cross-check against another client): headers, rows of display text, what it means."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str
    findings: tuple[str, ...] = ()  # what a reader must not miss (a disagreement beyond noise)
    words: tuple[str, ...] = ()  # headers of the columns after the first two that hold words, not numbers

    def numeric(self) -> list[bool]:
        """Per column, whether it is aligned right as a number: the first two and `words` are not."""
        return [i >= 2 and h not in self.words for i, h in enumerate(self.headers)]


# A point with a TTFT breakdown: (run, serving, isl, osl, conc, its ttft_breakdown).
Breakdown = tuple[str, str, Any, Any, int, dict[str, Any]]


@dataclass
class Report:
    runs: list[Run]
    baseline: str | None  # the baseline run's label
    table: pd.DataFrame
    skipped: list[Skipped]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # of the notes, those about a file's bad field
    root: Path = field(default_factory=Path.cwd)
    # Disaggregated vs aggregated, per shape that has both.
    decisions: list[ShapeDecision] = field(default_factory=list)
    slo: dict[str, float] | None = None
    breakdowns: list[Breakdown] = field(default_factory=list)  # table order
    drifts: list[Drift] = field(default_factory=list)  # runs whose points checked their outputs
    accuracy: list[AccuracyRow] = field(default_factory=list)  # per run, phase, when and task
    sections: list[SectionTable] = field(default_factory=list)  # only the tables that have rows

    def rel(self, path: Path) -> str:
        """A path as shown in outputs: relative to `root` (stable across machines)."""
        try:
            return os.path.relpath(Path(path).resolve(), self.root.resolve())
        except ValueError:
            return str(path)

    @property
    def metrics(self) -> tuple[Metric, ...]:
        """The metrics the human-readable results table shows: the absolute throughputs only when
        some point's per-GPU figures are unknown; the optional percentiles are `tail_metrics` (the
        data outputs carry every metric)."""
        df = self.table
        absolute = not df.empty and bool(df["tput_per_gpu"].isna().any())
        return tuple(m for m in METRICS if (absolute or m.column not in ABSOLUTE) and m.column not in OPTIONAL)

    @property
    def tail_metrics(self) -> tuple[Metric, ...]:
        """The optional latency percentiles some point has: a table of their own in markdown and
        HTML (the results table keeps to a 1400 px window), beside the others in a terminal."""
        df = self.table
        return tuple(m for m in METRICS if m.column in OPTIONAL and not df.empty and bool(df[m.column].notna().any()))
