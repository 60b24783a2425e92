"""What a reader needs to know to trust a run's numbers, in words: a run that did not succeed,
failed counts derived or unknown, GPU splits guessed or unknown, points unverified, cut short or
invalid."""

from __future__ import annotations

from harness.report.points import Point, Run
from harness.rundir.paths import STATUS


def run_notes(runs: list[Run]) -> list[str]:
    """Notes a reader needs to trust the numbers: failed runs, derived counts, unknown GPU splits."""
    notes: list[str] = []
    for run in runs:
        if run.status is not None and run.status.get("state") != "succeeded":
            reason = run.status.get("reason")
            notes.append(f"{run.label}: run state {run.status.get('state')!s}" + (f" ({reason})" if reason else ""))
        elif run.status is None and run.is_pdbench_run:
            notes.append(f"{run.label}: no {STATUS} (the run did not finish)")
        if not run.points:
            notes.append(f"{run.label}: no usable result files")
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
            notes.append(f"{run.label}: {text} ({which})")
        for p in run.points:
            if p.stop_reason:
                unsent = f" ({p.not_sent} never sent)" if p.not_sent else ""
                notes.append(
                    f"{run.label}: conc {p.concurrency} ended before every request was done{unsent}: {p.stop_reason}"
                )
            if p.valid is False:
                why = "; ".join(p.validity_reasons) or "no reason given"
                notes.append(f"{run.label}: conc {p.concurrency} is INVALID: {why}")
    return notes
