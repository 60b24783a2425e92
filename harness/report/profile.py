"""Profiled points as a table (the result's `profile` section, harness.bench.profile): beside each
point, what profiling cost (profiled over unprofiled figures) and where its traces are."""

from __future__ import annotations

from harness.report.model import SectionTable
from harness.report.points import Point, Run, serving
from harness.rundir.profile_summary import ProfileSummary

PROFILE_HEADERS = (
    "Run",
    "Serving",
    "ISL",
    "OSL",
    "Conc",
    "Tool",
    "Out tok/s profiled/unprofiled",
    "TTFT x",
    "TPOT x",
    "Traces",
    "Problems",
)


def _ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def _row(run: Run, p: Point, s: ProfileSummary) -> tuple[str, ...]:
    ratios = s.perturbation or {}
    profiled = "–" if s.profiled is None else f"{s.profiled.output_throughput:.1f}"
    unprofiled = "measured window" if s.unprofiled is None else f"{s.unprofiled.output_throughput:.1f}"
    traces = ", ".join(f"{t.instance} {len(t.files)}" for t in s.servers)
    problems = [f"{t.instance}: {t.error}" for t in s.servers if t.error] + s.errors
    return (
        run.label,
        serving(p),
        "–" if p.isl is None else str(p.isl),
        "–" if p.osl is None else str(p.osl),
        str(p.concurrency),
        s.tool,
        f"{profiled} / {unprofiled}",
        _ratio(ratios.get("median_ttft_ms")),
        _ratio(ratios.get("median_tpot_ms")),
        traces or "–",
        "; ".join(problems) or "–",
    )


def profile_table(runs: list[Run]) -> SectionTable | None:
    found = sorted(
        ((run, p) for run in runs for p in run.points if p.profile is not None),
        key=lambda rp: (rp[0].label, rp[1].isl or -1, rp[1].osl or -1, rp[1].concurrency, serving(rp[1])),
    )
    if not found:
        return None
    rows = []
    for run, p in found:
        assert p.profile is not None
        rows.append(_row(run, p, p.profile))
    return SectionTable(
        "Profiled points",
        PROFILE_HEADERS,
        tuple(rows),
        "Each profiled point ran its measured requests unprofiled (the point's numbers everywhere else "
        "in this report), then as many again with the profiler on (docs/profiling.md). TTFT x and TPOT x: "
        "the profiled window's median over the unprofiled one (1.00: no cost). Traces: files per server "
        "instance under profiles/<point>/<instance>/ of the run directory; 'measured window': the point "
        "itself was profiled (perturbation: false), its numbers carry the profiler's cost.",
    )
