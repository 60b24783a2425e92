"""The points' bottleneck verdicts as a table (the result's `bottleneck` section; the rules:
harness.validity.bottleneck), and per sweep (a run's points of one serving kind and shape, in
concurrency order) one line saying where the limit moves."""

from __future__ import annotations

from itertools import groupby

from harness.report.model import SectionTable
from harness.report.points import Point, Run, serving
from harness.rundir.bottleneck_summary import BottleneckSummary, RoleTiming

BOTTLENECK_HEADERS = (
    "Run",
    "Serving",
    "ISL",
    "OSL",
    "Conc",
    "Verdict",
    "Dominant",
    "Prefill queue/compute",
    "Decode TPOT",
    "KV transfer",
    "Client CPU",
    "Why",
)


def _ms_text(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _grown(text: str, growth: float | None) -> str:
    return text if growth is None else f"{text} ({growth:.1f}x)"


def _prefill(r: RoleTiming | None, growth: float | None) -> str:
    if r is None:
        return "–"
    return _grown(f"{_ms_text(r.queue_ms)}/{_ms_text(r.compute_ms)}", growth)


def _row(run: Run, p: Point, b: BottleneckSummary) -> tuple[str, ...]:
    e = b.evidence
    decode = e.roles.get("decode") or e.roles.get("aggregated")  # an aggregated instance does both
    dominant = "–" if b.dominant is None else f"{b.dominant} {e.shares[b.dominant]:.0%}"
    return (
        run.label,
        serving(p),
        "–" if p.isl is None else str(p.isl),
        "–" if p.osl is None else str(p.osl),
        str(p.concurrency),
        b.verdict,
        dominant,
        _prefill(e.roles.get("prefill") or e.roles.get("aggregated"), e.growth.get("prefill")),
        _grown(_ms_text(decode.tpot_ms if decode else None), e.growth.get("decode")),
        _grown(_ms_text(e.kv_transfer_ms), e.kv_growth),
        "–" if e.client_cpu_busy is None else f"{e.client_cpu_busy:.0%}",
        "; ".join(b.reasons) or "no rule fired",
    )


def _key(run: Run, p: Point) -> tuple[str, str, int, int]:
    return (run.label, serving(p), p.isl or -1, p.osl or -1)


def limit_line(run: Run, points: list[Point]) -> str | None:
    """Where the limit moves along one sweep's points (concurrency order): "decode-bound from C=16";
    None for a sweep of fewer than two points with a verdict."""
    judged = [(p.concurrency, p.bottleneck.verdict) for p in points if p.bottleneck is not None]
    if len(judged) < 2:
        return None
    spans = [(v, [c for c, _ in grp]) for v, grp in groupby(judged, key=lambda cv: cv[1])]
    p0 = points[0]
    where = f"{run.label} ({serving(p0)}, ISL {p0.isl}, OSL {p0.osl})"
    if len(spans) == 1:
        return f"{where}: {spans[0][0]} at every concurrency (C={judged[0][0]}–{judged[-1][0]})"
    parts = [f"{v} at C={cs[0]}" + (f"–{cs[-1]}" if len(cs) > 1 else "") for v, cs in spans[:-1]]
    return f"{where}: {', '.join(parts)}; {spans[-1][0]} from C={spans[-1][1][0]}"


# The issue's bar for the breakdown: its parts add up to TTFT within 2 % for 95 % of requests.
ADDS_UP_SHARE = 0.95


def adds_up_finding(run: Run, p: Point) -> str | None:
    """A finding when fewer than ADDS_UP_SHARE of the point's requests have parts that add up."""
    a = (p.ttft_breakdown or {}).get("adds_up")
    if not isinstance(a, dict) or a.get("share") is None or a["share"] >= ADDS_UP_SHARE:
        return None
    return (
        f"{run.label} ({serving(p)}, C={p.concurrency}): the TTFT parts add up within {a['within']:.0%} "
        f"for {a['requests']} of {a['of']} requests ({a['share']:.0%}; the bar is {ADDS_UP_SHARE:.0%})"
    )


def _judged(runs: list[Run]) -> list[tuple[Run, Point]]:
    """Every point with a verdict, by sweep (run, serving kind, ISL, OSL), then concurrency."""
    return sorted(
        ((run, p) for run in runs for p in run.points if p.bottleneck is not None),
        key=lambda rp: (*_key(*rp), rp[1].concurrency),
    )


def limit_lines(runs: list[Run]) -> list[str]:
    """limit_line for every sweep of the runs that has one, in the table's order."""
    lines = []
    for _, grp in groupby(_judged(runs), key=lambda rp: _key(*rp)):
        sweep = list(grp)
        line = limit_line(sweep[0][0], [p for _, p in sweep])
        if line is not None:
            lines.append(line)
    return lines


def bottleneck_table(runs: list[Run]) -> SectionTable | None:
    found = _judged(runs)
    if not found:
        return None
    rows = []
    for run, p in found:
        assert p.bottleneck is not None
        rows.append(_row(run, p, p.bottleneck))
    lines = limit_lines(runs)
    lines += [f for run, p in found if (f := adds_up_finding(run, p)) is not None]
    return SectionTable(
        "Bottleneck per point",
        BOTTLENECK_HEADERS,
        tuple(rows),
        "Verdict: the saturated resource in which a request spends the most time (its part of TTFT; decode's "
        "also every token after the first; client and router first), or "
        "'not saturated' (docs/decide.md gives the rules and thresholds). Dominant: the part of TTFT with "
        "the largest share of the per-request means. Prefill queue/compute, Decode TPOT and KV transfer "
        "are point means of vLLM's own histograms in ms, not per request; (Nx): growth over the sweep's "
        "lowest concurrency. Client CPU: the busiest load process.",
        tuple(lines),
    )
