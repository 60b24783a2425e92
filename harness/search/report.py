"""A search's report: report.md for people, report.json for programs, pareto.png for the eye.

Every candidate is listed, run or not, with its status and the reason for it; per SLO its best
concurrency, goodput per device ± the half-width of its t-interval, and the side that limited it.
Then the winner per SLO (or the tie), the aggregated baseline with its ratio, and the device-hours
spent against the full grid's estimate (harness.search.decide says what each means). The plot
draws every measured point of every candidate, throughput per device against interactivity:
each candidate's Pareto front over its ladder points as a line, repeats as small rings, a cross
over each point meeting no SLO, and each SLO's winner as a star with its interval. All three files are written atomically; their
names are harness.search.search_dir's.

Prediction (harness.search.foresee): per candidate, measured or pruned (and by which rule: the
throughput bound, the prediction, the budget), per SLO its objective as predicted before it ran
with its band, and for a measured one the error of that prediction against the measured mean.

Where the limit moves: from each candidate's run directory, read as `pdbench report` reads it,
the report's own line per sweep (harness.report.bottleneck.limit_lines) and, per SLO, the
verdict of the candidate's best point (its first measurement, the run's top-level file).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import atomic
from harness.report.bottleneck import limit_lines
from harness.report.load import load_runs
from harness.report.pareto import pareto_front
from harness.search.decide import Choice, Spend, choose_all, spend
from harness.search.foresee import SLOForecast, error
from harness.search.outcome import ReportEntry
from harness.search.search_dir import PARETO, REPORT_JSON, REPORT_MD

X_LABEL = "Interactivity (tok/s/user = 1000 / median TPOT)"
Y_LABEL = "Total throughput per device (tok/s/device)"
WINNER_MARKERS = ("*", "P", "D", "X")  # one per SLO


@dataclass(frozen=True)
class Limits:
    """A candidate's bottleneck verdicts, read from its run directory's points."""

    lines: tuple[str, ...]  # the run report's line per sweep: where the limit moves
    at_best: Mapping[str, tuple[int, str | None]]  # per SLO with a best point: (c, its verdict or None)

    def best_text(self, slo: str, name: str) -> str | None:
        if slo not in self.at_best:
            return None
        c, verdict = self.at_best[slo]
        return f"{name} {verdict or 'no verdict recorded'} at c={c}"

    def to_json(self) -> dict[str, Any]:
        return {
            "lines": list(self.lines),
            "at_best": {slo: {"concurrency": c, "verdict": v} for slo, (c, v) in self.at_best.items()},
        }


def read_limits(e: ReportEntry) -> Limits | None:
    """The candidate's verdicts from its run directory; None before it has one. The run is
    labelled by the candidate's name, so its lines name the candidate."""
    if e.run is None or not e.run.is_dir():
        return None
    runs = load_runs([e.run], labels={e.run: e.candidate.name}).runs
    at_best: dict[str, tuple[int, str | None]] = {}
    for slo, o in (e.outcome.slos if e.outcome else {}).items():
        if o.best is None:
            continue
        found = [p.bottleneck for run in runs for p in run.points if p.concurrency == o.best and p.bottleneck]
        at_best[slo] = (o.best, found[0].verdict if found else None)
    return Limits(tuple(limit_lines(runs)), at_best)


def _limit_section(
    slos: Mapping[str, Mapping[str, float]], entries: Sequence[ReportEntry], limits: Mapping[str, Limits | None]
) -> list[str]:
    found = [(e.candidate.name, lim) for e in entries if (lim := limits.get(e.candidate.name)) is not None]
    if not any(lim.lines or any(v for _, v in lim.at_best.values()) for _, lim in found):
        return []  # results written before the verdict existed
    lines = [f"- {line}" for _, lim in found for line in lim.lines]
    for slo in slos:
        best = [t for name, lim in found if (t := lim.best_text(slo, name)) is not None]
        if best:
            lines.append(f"- **{slo}**, at each candidate's best point: " + "; ".join(best))
    return [
        "## Where the limit moves",
        "",
        "Per candidate, its run's line of `pdbench report`'s bottleneck table (docs/decide.md gives the rules); "
        "then per SLO, the limit each candidate met at its best point.",
        "",
        *lines,
        "",
    ]


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _bounds(bounds: Mapping[str, float]) -> str:
    return ", ".join(f"{k} <= {v:g} ms" for k, v in bounds.items())


def _devices(e: ReportEntry) -> str:
    c = e.candidate
    return f"agg {c.devices}" if c.kind == "agg" else f"{c.prefill_devices}/{c.decode_devices}"


def _slo_cells(e: ReportEntry, slo: str) -> list[str]:
    o = e.outcome.slos.get(slo) if e.outcome else None
    if o is None:
        return ["", "", ""]
    if o.best is None or o.interval is None:
        return ["none meets", "", o.limit.text()]
    value = f"{o.interval.text()} (n={o.interval.n})"
    return [str(o.best), value, o.limit.text()]


def _how(e: ReportEntry) -> str:
    """Measured, or pruned by which rule (or skipped by the budget), or the status as it is."""
    if e.outcome is not None:
        return "measured"
    if e.status == "skipped" and e.pruned_by:
        return "budget" if e.pruned_by == "budget" else f"pruned: {e.pruned_by}"
    return e.status


def _prediction_cells(e: ReportEntry, slo: str) -> list[str]:
    s = ((e.forecast or {}).get("slos") or {}).get(slo)
    if s is None:
        return ["", ""]
    predicted = SLOForecast.from_json(s).text()
    err = error(e.forecast, e.outcome, slo)
    return [predicted, "" if err is None else f"{err:+.1%}"]


def _run(e: ReportEntry, search_dir: Path) -> str | None:
    if e.run is None:
        return None
    try:
        return str(e.run.relative_to(search_dir))
    except ValueError:
        return str(e.run)


@dataclass(frozen=True)
class _Report:
    """What report.md and report.json both say, gathered once."""

    title: str
    search_dir: Path
    ladder: Sequence[int]
    slos: Mapping[str, Mapping[str, float]]
    entries: Sequence[ReportEntry]
    choices: Mapping[str, Choice]
    spent: Spend
    limits: Mapping[str, Limits | None]


def _markdown(r: _Report) -> str:
    confidence = next(
        (o.interval.confidence for e in r.entries if e.outcome for o in e.outcome.slos.values() if o.interval), 0.95
    )
    lines = [
        f"# Search {r.title}",
        "",
        f"Ladder: {', '.join(map(str, r.ladder))}. SLOs: "
        + "; ".join(f"**{name}** {_bounds(b)}" for name, b in r.slos.items())
        + ".",
        "",
        "Goodput per device: total token throughput / devices at the highest concurrency meeting the SLO, "
        f"the mean of its measurements ± the half-width of their {confidence:.0%} t-interval (? when measured once).",
        "",
        "## Winners",
        "",
        *(f"- {r.choices[name].text()}" for name in r.slos),
        "",
        "## Candidates",
        "",
    ]
    predicted = any(e.forecast for e in r.entries)  # the columns of a search that predicted
    head = ["candidate", "P/D devices", "status", "measured or pruned", "reason"]
    for name in r.slos:
        head += [f"{name}: best c", f"{name}: tok/s/device", f"{name}: limit"]
        if predicted:
            head += [f"{name}: predicted before it ran [band]", f"{name}: prediction error"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in r.entries:
        row = [e.candidate.name, _devices(e), e.status, _how(e), e.reason]
        for name in r.slos:
            row += _slo_cells(e, name) + (_prediction_cells(e, name) if predicted else [])
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines += ["", *_limit_section(r.slos, r.entries, r.limits)]
    lines += ["## Cost", "", r.spent.text() + ".", ""]
    notes = [(e.candidate.name, n) for e in r.entries if e.outcome for n in e.outcome.notes]
    if notes:
        lines += ["## Notes", "", *(f"- {name}: {n}" for name, n in notes), ""]
    return "\n".join(lines)


def _as_json(r: _Report) -> dict[str, Any]:
    candidates = []
    for e in r.entries:
        c = e.candidate
        candidates.append(
            {
                "name": c.name,
                "kind": c.kind,
                "prefill_devices": c.prefill_devices,
                "decode_devices": c.decode_devices,
                "devices": c.devices,
                "nodes": c.nodes,
                "capacity": dict(c.capacity),
                "overrides": list(c.overrides),
                "status": e.status,
                "reason": e.reason,
                "run": _run(e, r.search_dir),
                "outcome": e.outcome.to_json() if e.outcome else None,
                "limits": lim.to_json() if (lim := r.limits.get(c.name)) else None,
                "earlier": [o.to_json() for o in e.earlier],
                "measured_or_pruned": _how(e),
                "pruned_by": e.pruned_by,
                "forecast": dict(e.forecast) if e.forecast else None,
                "prediction_error": {name: error(e.forecast, e.outcome, name) for name in r.slos},
            }
        )
    return {
        "search": r.title,
        "ladder": list(r.ladder),
        "slos": {name: dict(b) for name, b in r.slos.items()},
        "candidates": candidates,
        "winners": {name: choice.to_json() for name, choice in r.choices.items()},
        "spend": r.spent.to_json(),
    }


def plot(path: Path, entries: Sequence[ReportEntry], choices: Mapping[str, Choice], title: str) -> Path:
    """pareto.png: every candidate's points and front, each SLO's winner starred."""
    from matplotlib import rcParams
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colours = [c["color"] for c in rcParams["axes.prop_cycle"]]
    drawn = [(e.candidate, e.outcome) for e in entries if e.outcome and e.outcome.points]
    any_failing = any_repeat = False
    for i, (c, out) in enumerate(drawn):
        colour = colours[i % len(colours)]
        label = c.name + (" (aggregated)" if c.kind == "agg" else "")
        # The front runs through the ladder's first measurements; a lucky repeat must not make it.
        pts = [(p.interactivity, p.goodput_per_device) for p in out.points if p.interactivity and p.repeat == 0]
        front = pareto_front(pts)
        ax.plot([p[0] for p in front], [p[1] for p in front], marker="o", color=colour, label=label)
        others = [p for p in pts if p not in front]
        if others:
            ax.plot([p[0] for p in others], [p[1] for p in others], "o", alpha=0.35, color=colour, label="_others")
        repeats = [(p.interactivity, p.goodput_per_device) for p in out.points if p.interactivity and p.repeat]
        if repeats:
            ax.plot(
                [x for x, _ in repeats],
                [y for _, y in repeats],
                "o",
                markersize=4,
                markerfacecolor="none",
                color=colour,
                label="_repeats",
            )
            any_repeat = True
        failing = [
            (p.interactivity, p.goodput_per_device)
            for p in out.points
            if p.interactivity is not None and not any(p.meets.values())
        ]
        if failing:
            ax.plot(
                [x for x, _ in failing],
                [y for _, y in failing],
                "x",
                markersize=9,
                color=colour,
                label="_failing",
            )
            any_failing = True
        for p in out.points:
            if p.interactivity is not None and p.repeat == 0:
                ax.annotate(
                    f"c{p.concurrency}",
                    (p.interactivity, p.goodput_per_device),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=8,
                    color=colour,
                )
    if any_failing:  # one neutral legend entry for the crosses of every candidate
        ax.plot([], [], "x", markersize=9, color="black", label="meets no SLO")
    if any_repeat:
        ax.plot([], [], "o", markersize=4, markerfacecolor="none", color="black", label="a repeat of a best point")
    by_name = {c.name: out for c, out in drawn}
    for k, (slo, choice) in enumerate(choices.items()):
        w = choice.winner
        won = by_name.get(w.name) if w else None
        if w is None or won is None:
            continue
        xs = [p.interactivity for p in won.points if p.concurrency == w.concurrency and p.interactivity]
        if not xs:
            continue
        hw = w.interval.half_width
        ax.errorbar(
            [sum(xs) / len(xs)],
            [w.interval.mean],
            yerr=[[hw], [hw]] if math.isfinite(hw) else None,
            marker=WINNER_MARKERS[k % len(WINNER_MARKERS)],
            markersize=14,
            color="black",
            linestyle="none",
            label=f"{slo} {'tie' if choice.ties else 'winner'}: {w.name} at c={w.concurrency} (mean ± half-width)",
        )
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(Y_LABEL)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    atomic.write_with(path, lambda f: fig.savefig(f, format="png"))
    return path


def write_report(
    search_dir: Path,
    ladder: Sequence[int],
    slos: Mapping[str, Mapping[str, float]],
    entries: Sequence[ReportEntry],
    *,
    title: str | None = None,
) -> list[Path]:
    """Write report.md, report.json and pareto.png into the search directory; their paths.
    `title` names the search (its name); the directory's name by default."""
    search_dir = Path(search_dir)
    title = title or search_dir.name
    search_dir.mkdir(parents=True, exist_ok=True)
    r = _Report(
        title=title,
        search_dir=search_dir,
        ladder=ladder,
        slos=slos,
        entries=entries,
        choices=choose_all(entries, slos),
        spent=spend(entries, ladder),
        limits={e.candidate.name: read_limits(e) for e in entries},
    )
    md = atomic.write_text(search_dir / REPORT_MD, _markdown(r))
    js = atomic.write_text(search_dir / REPORT_JSON, json.dumps(_as_json(r), indent=2, allow_nan=False) + "\n")
    png = plot(search_dir / PARETO, entries, r.choices, f"Search {title}: throughput per device vs interactivity")
    return [md, js, png]
