"""Runs -> Report: one table row per run and point (per-GPU and latency metrics), sorted by shape
and concurrency, deltas against the baseline run, the notes, the decisions and the breakdowns.
Output modules only format what is built here."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from harness.config.slo import result_key
from harness.report.accuracy import accuracy_rows
from harness.report.arms import arms_table
from harness.report.bottleneck import bottleneck_table
from harness.report.breakdown import breakdowns, columns
from harness.report.crosscheck import crosscheck
from harness.report.decide import decide
from harness.report.deltas import with_deltas
from harness.report.energy import energy_table
from harness.report.explain import router_notes, run_notes
from harness.report.kv_handoff import kv_handoff_table
from harness.report.load import dedupe, load_runs
from harness.report.model import BREAKDOWN_COLUMNS, ID_COLUMNS, METRICS, OUTPUT_COLUMNS, Report
from harness.report.normalise import interactivity, per_gpu
from harness.report.outputs_check import drifts, outputs_text
from harness.report.points import Note, Point, Run, serving
from harness.report.prior import prior_table
from harness.report.profile import profile_table
from harness.report.slo import slo_notes
from harness.report.slo_pick import slo_table
from harness.report.truth import truth_tables
from harness.report.truth_text import truth_sections
from harness.report.workloads import prefix_cache_table, schedule_table, sessions_table


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
        "requests": p.requests,
        "prefill_gpus": p.prefill_gpus,
        "decode_gpus": p.decode_gpus,
        "valid": p.valid,
        "verdict": p.verdict,
        "validity_reasons": "; ".join(p.validity_reasons),
        "outputs": outputs_text(p.sentinels, p.outputs_match),
        "outputs_match_rate": math.nan
        if p.sentinels is None or p.sentinels.match_rate is None
        else p.sentinels.match_rate,
        "source": p.source,
        "file": rel(p.path),
        "tput_per_gpu": tput,
        "output_tput_per_gpu": out,
        "input_tput_per_gpu": inp,
        "total_tput": p.total_token_throughput,
        "output_tput": p.output_throughput,
        **{m.column: ms.get(m.column, math.nan) for m in METRICS if m.kind == "ms"},
        "intvty": interactivity(ms.get("median_tpot_ms")),
        "failed": math.nan if p.failed is None else float(p.failed),
    } | columns(p.ttft_breakdown)


def _table(runs: list[Run], base_run: Run | None, rel: Any, extra_ms: tuple[str, ...] = ()) -> pd.DataFrame:
    """The rows in reading order: by ISL, OSL and concurrency, then run, a disaggregated point
    before its aggregated baseline. `extra_ms`: result keys (in ms) an SLO bounds that the
    table's own columns lack, added after them."""
    order = {run.label: i for i, run in enumerate(runs)}
    rows = [
        _row(run, p, run is base_run, rel) | {k: p.ms.get(k, math.nan) for k in extra_ms}
        for run in runs
        for p in run.points
    ]
    checked = any(r["outputs"] is not None for r in rows)
    broken_down = any(not math.isnan(r["ttft_breakdown_requests"]) for r in rows)
    at = ID_COLUMNS.index("source")  # the outputs check goes beside the validity columns
    ids = [*ID_COLUMNS[:at], *(OUTPUT_COLUMNS if checked else ()), *ID_COLUMNS[at:]]
    names = ids + [m.column for m in METRICS] + list(BREAKDOWN_COLUMNS if broken_down else ())
    names += [k for k in extra_ms if k not in names]
    df = pd.DataFrame(rows, columns=names)
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
        for col in ("isl", "osl", "requests", "prefill_gpus", "decode_gpus"):
            df[col] = df[col].astype("Int64")
        df["valid"] = df["valid"].astype("boolean")
    return df


def build_report(
    run_paths: list[Path],
    baseline: Path | None = None,
    root: Path | None = None,
    slo: dict[str, float] | None = None,
    labels: dict[Path, str] | None = None,
) -> Report:
    """Load the runs (the baseline first when given), build the table and the deltas. `labels`
    names runs by the path given, in place of the names their directories give them."""
    paths = ([baseline] if baseline is not None else []) + [p for p in run_paths]
    loaded = load_runs(paths, labels)
    dedupe(loaded)
    report = Report(
        runs=loaded.runs, baseline=None, table=pd.DataFrame(), skipped=loaded.skipped, root=root or Path.cwd()
    )
    report.notes += [f"{report.rel(n.path)}: {n.text}" for n in loaded.notes]
    report.warnings = [f"{report.rel(n.path)}: {n.text}" for n in loaded.notes if n.warning]
    base_run = loaded.runs[0] if baseline is not None else None
    if base_run is not None:
        report.baseline = base_run.label
    df = _table(loaded.runs, base_run, report.rel, tuple(result_key(k) for k in slo or ()))
    if base_run is not None:
        df, notes = with_deltas(df)
        report.notes += notes
    report.notes += run_notes(loaded.runs) + router_notes(loaded.runs)
    report.table = df
    report.slo = slo
    report.decisions = decide(df, slo)
    if slo:
        report.notes += slo_notes(df, slo, [(d.isl, d.osl) for d in report.decisions])
    report.breakdowns = breakdowns(loaded.runs)
    report.drifts = drifts(loaded.runs)
    report.accuracy, accuracy_notes = accuracy_rows(loaded.runs)
    report.notes += accuracy_notes
    client_notes: list[Note] = []
    arm_notes: list[Note] = []
    prior_notes: list[Note] = []
    energy_notes: list[Note] = []
    tables = (
        arms_table(loaded.runs, arm_notes),
        slo_table(df, slo) if slo else None,
        sessions_table(loaded.runs),
        schedule_table(loaded.runs),
        prefix_cache_table(loaded.runs),
        bottleneck_table(loaded.runs),
        kv_handoff_table(loaded.runs),
        profile_table(loaded.runs),
        prior_table(loaded.runs, prior_notes),
        energy_table(loaded.runs, energy_notes, slo),
    )
    report.sections = truth_sections(truth_tables(loaded.runs, slo), slo)  # the answer first
    report.sections += [t for t in (*tables, crosscheck(loaded.runs, client_notes)) if t is not None]
    report.notes += [f"{report.rel(n.path)}: {n.text}" for n in client_notes + arm_notes + prior_notes + energy_notes]
    return report
