"""Each point's GPU energy and cost (power/points/<result>, written by node 0: harness.power) as a
table, and where a run's disaggregated sweep becomes cheaper per output token than its aggregated
baseline, counting only correct points (valid, outputs not failed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pydantic import ValidationError

from harness.power.energy import GroupPower, PointPower
from harness.report.model import SectionTable
from harness.report.point_slo import failures
from harness.report.points import Note, Point, Run, serving
from harness.rundir import RunDir

HEADERS = (
    "Run",
    "Serving",
    "ISL",
    "Conc",
    "Power",
    "Prefill J/in tok",
    "Decode J/out tok",
    "J/request",
    "Prefill W mean/peak",
    "Decode W mean/peak",
    "All W mean/peak",
    "Prefill $/Mtok in",
    "Decode $/Mtok out",
    "$/Mtok out",
)


def point_power(run: Run, p: Point) -> PointPower | None:
    """The point's record, or None where the run has none for it (another tool's file, an older run,
    a record that does not read)."""
    if p.path.parent != run.path:
        return None
    f = RunDir(run.path).power_point(p.path.name)
    try:
        return PointPower.model_validate_json(f.read_text())
    except (OSError, ValidationError):
        return None


def correct(p: Point, slo: Mapping[str, float] | None = None) -> bool:
    """A point whose tokens count: valid, no request failed, not cut short, its outputs not found to
    differ, and within the report's SLO when one is given."""
    return p.valid is not False and not failures(p, slo or {}) and p.outputs_match != "failed"


def _slo_text(slo: Mapping[str, float]) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in slo.items())


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None else f"{v:{fmt}}"


def _watts(g: GroupPower | None) -> str:
    return "–" if g is None else f"{g.mean_w:.0f}/{g.peak_w:.0f}"


def _power(pp: PointPower) -> str:
    if pp.power_valid:
        return "valid"
    if pp.power_valid is None:
        return f"missing: {pp.missing}" if pp.missing else "missing"
    return "invalid: " + "; ".join(pp.reasons)


def _row(run: Run, p: Point, pp: PointPower) -> tuple[str, ...]:
    pre, dec, c = pp.roles.get("prefill"), pp.roles.get("decode"), pp.cost
    per_mtok: Callable[[str], str] = lambda k: _num(None if c is None else getattr(c, k), ".3f")  # noqa: E731
    return (
        run.label,
        serving(p),
        "–" if p.isl is None else str(p.isl),
        str(p.concurrency),
        _power(pp),
        _num(None if pre is None else pre.j_per_input_token, ".4f"),
        _num(None if dec is None else dec.j_per_output_token, ".3f"),
        _num(None if pp.total is None else pp.total.j_per_request, ",.0f"),
        _watts(pre),
        _watts(dec),
        _watts(pp.total),
        per_mtok("prefill_usd_per_mtok_input"),
        per_mtok("decode_usd_per_mtok_output"),
        per_mtok("usd_per_mtok_output"),
    )


def break_even(found: list[tuple[Run, Point, PointPower]], slo: Mapping[str, float] | None = None) -> list[str]:
    """Per run and shape with both kinds of point: from which concurrency on the disaggregated
    points cost less per output token than the aggregated ones at the same concurrency, among
    the correct points (meeting the SLO when one is given)."""
    cost: dict[tuple[str, int | None, int | None], dict[str, dict[int, float]]] = {}
    for run, p, pp in found:
        usd = None if pp.cost is None else pp.cost.usd_per_mtok_output
        if usd is None or not correct(p, slo):
            continue
        cost.setdefault((run.label, p.isl, p.osl), {}).setdefault(serving(p), {})[p.concurrency] = usd
    out = []
    for (label, isl, osl), by in sorted(cost.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1, kv[0][2] or -1)):
        both = sorted(set(by.get("disagg", {})) & set(by.get("agg", {})))
        if not both:
            continue
        shape = f"{label} (ISL {isl or '–'}, OSL {osl or '–'})"
        cheaper = [c for c in both if by["disagg"][c] < by["agg"][c]]
        # the lowest concurrency from which disaggregation stays cheaper at every higher one compared
        start = next((c for i, c in enumerate(both) if all(x in cheaper for x in both[i:])), None)
        pairs = ", ".join(f"C={c} ${by['disagg'][c]:.3f} vs ${by['agg'][c]:.3f}" for c in both)
        if start is None:
            out.append(
                f"{shape}: disaggregated is not cheaper per output token at the highest concurrency compared ({pairs})"
            )
        else:
            out.append(f"{shape}: disaggregated is cheaper per output token from C={start} on ({pairs})")
    return out


def _blank(pp: PointPower) -> bool:
    """Nothing to show: no telemetry and no price (a site without GPUs or prices, a CPU cluster)."""
    return pp.power_valid is None and pp.cost is None


def energy_table(runs: list[Run], notes: list[Note], slo: Mapping[str, float] | None = None) -> SectionTable | None:
    """The table of every run's points; a run none of whose points has power or a price gets one
    line in `notes` instead of a row of dashes a point."""
    found = []
    for run in runs:
        mine = [(run, p, pp) for p in run.points if (pp := point_power(run, p)) is not None]
        if mine and all(_blank(pp) for _, _, pp in mine):
            why = next((pp.missing for _, _, pp in mine if pp.missing), None)
            notes.append(Note(run.path, "no GPU power and no price on any point" + (f" ({why})" if why else "")))
            continue
        found += mine
    if not found:
        return None
    found.sort(key=lambda f: (f[0].label, f[1].isl or -1, f[1].concurrency, serving(f[1]) == "agg"))
    return SectionTable(
        "Energy and cost per point",
        HEADERS,
        tuple(_row(run, p, pp) for run, p, pp in found),
        "GPU board power sampled on every node through the point's measured window (NVML or the SMI), "
        "integrated per GPU as InferenceX does: a role's energy is its GPUs' over the whole window. "
        "J/in tok: prefill's GPUs over the point's input tokens; J/out tok: decode's over its output tokens; "
        "J/request and All W: every GPU of the point. W mean is per GPU, W peak the highest one reading. "
        "$: the GPUs' time at the cluster's site.gpu_hour_usd, plus their energy at site.kwh_usd where given; "
        "$/Mtok out divides every GPU's cost by the output tokens (the aggregated baseline's comparison). "
        "Power missing: no telemetry (never read as zero); invalid: a GPU's samples did not cover the window. "
        "The break-even counts correct points only (valid, no failed request, not cut short, outputs not "
        "failed" + (f", within the SLO {_slo_text(slo)})." if slo else ")."),
        tuple(break_even(found, slo)),
        words=("Power",),
    )
