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


# What only pdbench's proxy gives a run, named where a run went through another router.
WITHOUT_PDBENCH_PROXY = (
    "no TTFT breakdown and so no router-bound verdict (the router writes no per-request timings), "
    "and the bundled connector (pdbench) cannot run behind it; validity is judged from the servers' "
    "own /metrics and the outputs are checked against the reference as under pdbench's proxy"
)


def router_notes(runs: list[Run]) -> list[str]:
    """One note per run served through a router other than pdbench's proxy (metadata.proxy)."""
    notes = []
    for run in runs:
        kinds = {str(p.metadata.get("proxy")) for p in run.points if p.metadata.get("proxy") not in (None, "pdbench")}
        for kind in sorted(kinds):
            versions = sorted(
                {
                    str(r.get("version"))
                    for p in run.points
                    if isinstance(r := p.metadata.get("router"), dict) and r.get("kind") == kind and r.get("version")
                }
            )
            ran = f"{kind} {', '.join(versions)}" if versions else f"{kind} (version not recorded)"
            notes.append(f"{run.label}: served through {ran}: {WITHOUT_PDBENCH_PROXY}")
    return notes
