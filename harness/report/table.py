"""The report's table model: one row per run and point, per-GPU and latency metrics, and
signed deltas against a baseline run. Output modules only format what is computed here."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.report.load import Loaded, Point, Run, Skipped, dedupe, load_runs, serving


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
    Metric("median_ttft_ms", "TTFT p50 (ms)", -1, "ms"),
    Metric("p99_ttft_ms", "TTFT p99 (ms)", -1, "ms"),
    Metric("p99.9_ttft_ms", "TTFT p99.9 (ms)", -1, "ms"),
    Metric("median_tpot_ms", "TPOT p50 (ms)", -1, "ms"),
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
    "prefill_gpus",
    "decode_gpus",
    "valid",
    "verdict",
    "validity_reasons",
    "source",
    "file",
)


def per_gpu(total: float, output: float, prefill: int | None, decode: int | None) -> tuple[float, float, float]:
    """InferenceX's per-role normalisation (its #131): total over P+D, output over D (over P+D when
    D is 0), input (total - output) over P. NaN where the GPU split is unknown."""
    nan = math.nan
    if prefill is None or decode is None or prefill + decode <= 0:
        return nan, nan, nan
    tput = total / (prefill + decode)
    out = output / (decode if decode > 0 else prefill + decode)
    inp = (total - output) / prefill if prefill > 0 else nan
    return tput, out, inp


def interactivity(tpot_ms: float | None) -> float:
    """Tokens/s per user: 1000 / TPOT in ms (InferenceX's `*_intvty`)."""
    return 1000.0 / tpot_ms if tpot_ms else math.nan


@dataclass
class Report:
    runs: list[Run]
    baseline: str | None  # the baseline run's label
    table: pd.DataFrame
    skipped: list[Skipped]
    notes: list[str] = field(default_factory=list)
    root: Path = field(default_factory=Path.cwd)
    # Disaggregated vs aggregated, per shape that has both (harness.report.decide).
    decisions: list[Any] = field(default_factory=list)
    slo: dict[str, float] | None = None
    # Points with a TTFT breakdown: (run, serving, isl, osl, conc, its ttft_breakdown), table order.
    breakdowns: list[tuple[str, str, Any, Any, int, dict[str, Any]]] = field(default_factory=list)

    def rel(self, path: Path) -> str:
        """A path as shown in outputs: relative to `root` (stable across machines)."""
        try:
            return os.path.relpath(Path(path).resolve(), self.root.resolve())
        except ValueError:
            return str(path)

    @property
    def metrics(self) -> tuple[Metric, ...]:
        return METRICS


def _row(run: Run, p: Point, is_baseline: bool, rel: Any) -> dict[str, Any]:
    tput, out, inp = per_gpu(p.total_token_throughput, p.output_throughput, p.prefill_gpus, p.decode_gpus)
    ms = p.ms
    return {
        "run": run.label,
        "serving": serving(p),
        "baseline": is_baseline,
        "isl": p.isl,
        "osl": p.osl,
        "conc": p.concurrency,
        "prefill_gpus": p.prefill_gpus,
        "decode_gpus": p.decode_gpus,
        "valid": p.valid,
        "verdict": p.verdict,
        "validity_reasons": "; ".join(p.validity_reasons),
        "source": p.source,
        "file": rel(p.path),
        "tput_per_gpu": tput,
        "output_tput_per_gpu": out,
        "input_tput_per_gpu": inp,
        "median_ttft_ms": ms.get("median_ttft_ms", math.nan),
        "p99_ttft_ms": ms.get("p99_ttft_ms", math.nan),
        "p99.9_ttft_ms": ms.get("p99.9_ttft_ms", math.nan),
        "median_tpot_ms": ms.get("median_tpot_ms", math.nan),
        "intvty": interactivity(ms.get("median_tpot_ms")),
        "median_e2el_ms": ms.get("median_e2el_ms", math.nan),
        "p99_e2el_ms": ms.get("p99_e2el_ms", math.nan),
        "failed": math.nan if p.failed is None else float(p.failed),
    }


def export_frame(report: Report, decimals: int) -> pd.DataFrame:
    """The table for data outputs (CSV, JSON): rounded, counts as integers."""
    df = report.table.round(decimals)
    for col in ("failed", "failed_delta"):
        if col in df:
            df[col] = df[col].astype("Int64")
    return df


def _key(row: pd.Series) -> str:
    return f"{row['serving']}/{row['isl']}/{row['osl']}/{row['conc']}"


def build_report(
    run_paths: list[Path], baseline: Path | None = None, root: Path | None = None, slo: dict[str, float] | None = None
) -> Report:
    """Load the runs (the baseline first when given), build the table and the deltas."""
    paths = ([baseline] if baseline is not None else []) + [p for p in run_paths]
    loaded: Loaded = load_runs(paths)
    dedupe(loaded)
    report = Report(
        runs=loaded.runs, baseline=None, table=pd.DataFrame(), skipped=loaded.skipped, root=root or Path.cwd()
    )
    report.notes += [f"{report.rel(n.path)}: {n.text}" for n in loaded.notes]
    base_run = loaded.runs[0] if baseline is not None else None
    if base_run is not None:
        report.baseline = base_run.label
    order = {run.label: i for i, run in enumerate(loaded.runs)}
    rows = [_row(run, p, run is base_run, report.rel) for run in loaded.runs for p in run.points]
    columns = list(ID_COLUMNS) + [m.column for m in METRICS]
    df = pd.DataFrame(rows, columns=columns)
    if not df.empty:
        df["_order"] = df["run"].map(order)
        df["_isl"] = df["isl"].fillna(-1)
        df["_osl"] = df["osl"].fillna(-1)
        df = (
            df.sort_values(
                ["_isl", "_osl", "conc", "_order", "serving"],
                ascending=[True, True, True, True, False],  # disagg, then its baseline
                kind="stable",
            )
            .drop(columns=["_order", "_isl", "_osl"])
            .reset_index(drop=True)
        )
        for col in ("isl", "osl", "prefill_gpus", "decode_gpus"):
            df[col] = df[col].astype("Int64")
        df["valid"] = df["valid"].astype("boolean")
    if base_run is not None:
        df = _with_deltas(df, report)
    _explain(report, loaded, df)
    report.table = df
    from harness.report.decide import decide

    report.slo = slo
    report.decisions = decide(df, slo)
    report.breakdowns = sorted(
        (
            (run.label, serving(p), p.isl, p.osl, p.concurrency, p.ttft_breakdown)
            for run in loaded.runs
            for p in run.points
            if p.ttft_breakdown and p.ttft_breakdown.get("requests")
        ),
        key=lambda b: (b[2] or 0, b[3] or 0, b[0], b[1] != "disagg", b[4]),
    )
    return report


def _with_deltas(df: pd.DataFrame, report: Report) -> pd.DataFrame:
    cols = [m.column for m in METRICS]
    if df.empty:
        for c in cols:
            df[f"{c}_delta"], df[f"{c}_pct"] = pd.Series(dtype=float), pd.Series(dtype=float)
        return df
    df = df.copy()
    df["_key"] = df.apply(_key, axis=1)
    base = df[df["baseline"]][["_key", *cols]].rename(columns={c: f"{c}_base" for c in cols})
    base["_has_base"] = True
    merged = df.merge(base, on="_key", how="left")
    merged["_has_base"] = merged["_has_base"].fillna(False).astype(bool)
    for c in cols:
        b = merged[f"{c}_base"]
        delta = merged[c] - b
        pct = (delta / b * 100.0).where(b != 0)
        merged[f"{c}_delta"] = delta.where(~merged["baseline"])
        merged[f"{c}_pct"] = pct.where(~merged["baseline"])
    missing = merged[~merged["baseline"] & ~merged["_has_base"]]
    base_invalid = df[df["baseline"] & df["valid"].eq(False).fillna(False)]["_key"]
    for _, r in merged[~merged["baseline"] & merged["_key"].isin(set(base_invalid))].iterrows():
        report.notes.append(f"{r['run']}: conc {r['conc']} is compared with an INVALID baseline point")
    lacking: dict[str, list[str]] = {}
    for _, r in missing.iterrows():
        lacking.setdefault(r["run"], []).append(f"{_na(r['isl'])}/{_na(r['osl'])}/{r['conc']}")
    for run, keys in lacking.items():
        report.notes.append(f"{run}: no baseline point at ISL/OSL/conc {', '.join(keys)}; no deltas there")
    return merged.drop(columns=["_key", "_has_base", *[f"{c}_base" for c in cols]])


def _na(v: Any) -> str:
    return "n/a" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else str(v)


def _explain(report: Report, loaded: Loaded, df: pd.DataFrame) -> None:
    """Notes a reader needs to trust the numbers: failed runs, derived counts, unknown GPU splits."""
    for run in loaded.runs:
        if run.status is not None and run.status.get("state") != "succeeded":
            reason = run.status.get("reason")
            report.notes.append(
                f"{run.label}: run state {run.status.get('state')!s}" + (f" ({reason})" if reason else "")
            )
        elif run.status is None and run.is_pdbench_run:
            report.notes.append(f"{run.label}: no status.json (the run did not finish)")
        if not run.points:
            report.notes.append(f"{run.label}: no usable result files")
            continue
        groups: dict[str, list[Point]] = {}
        for p in run.points:
            if p.failed_derived:
                groups.setdefault("no `failed` key: failed = num_prompts - completed", []).append(p)
            elif p.failed is None:
                groups.setdefault("failed requests unknown (no `failed` key, no num_prompts)", []).append(p)
            if p.prefill_gpus is None:
                groups.setdefault(
                    "GPU split unknown (no metadata, no `_gpus_` in the file name): per-GPU throughput left blank", []
                ).append(p)
            elif p.gpus_from and p.gpus_from.startswith("file name (no ctx/gen"):
                groups.setdefault(
                    "no `_ctx_`/`_gen_` in the file name: all GPUs counted as prefill, decode 0 (as InferenceX does)",
                    [],
                ).append(p)
            if p.isl is None or p.osl is None:
                groups.setdefault("ISL/OSL unknown (not in the file, its metadata or its path)", []).append(p)
            if p.verdict == "unverified":
                groups.setdefault(
                    "UNVERIFIED: no evidence the point measured what it claims (no /metrics "
                    "verdict); `collect` leaves it out unless --include-unverified",
                    [],
                ).append(p)
        for text, points in groups.items():
            which = (
                "1 point"
                if len(run.points) == 1
                else f"all {len(points)} points"
                if len(points) == len(run.points)
                else ", ".join(f"conc {p.concurrency}" for p in points)
            )
            report.notes.append(f"{run.label}: {text} ({which})")
        for p in run.points:
            if p.stop_reason:
                report.notes.append(
                    f"{run.label}: conc {p.concurrency} ended before every request was done: {p.stop_reason}"
                )
            if p.valid is False:
                why = "; ".join(p.validity_reasons) or "no reason given"
                report.notes.append(f"{run.label}: conc {p.concurrency} is INVALID: {why}")
