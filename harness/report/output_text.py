"""The report for a terminal: rich tables that fit its width (80 columns and up).

The same sections as the markdown. Runs get a letter (A, B, ...) so the tables need no long run
names; the results are split into points, throughput and latency tables, and a section too wide
for 80 columns (accuracy) is written as lines, not a table.
"""

from __future__ import annotations

import io
import string
from collections.abc import Iterator
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from harness.report import breakdown_table, cells, check_text
from harness.report.decision_text import RATIO_HEADERS, ratio_rows, summary_lines
from harness.report.model import METRICS, Metric, Report
from harness.report.run_summary import run_summaries
from harness.report.text_fit import add_rows as _rows
from harness.report.text_fit import fit
from harness.report.text_fit import table as _table

THROUGHPUT_HEADERS = {
    "tput_per_gpu": "Total per GPU",
    "output_tput_per_gpu": "Output per decode GPU",
    "input_tput_per_gpu": "Input per prefill GPU",
    "intvty": "Per user",
    "total_tput": "Total",
    "output_tput": "Output",
}
PER_GPU = ("tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu", "intvty")
ABSOLUTE = ("total_tput", "output_tput")
LATENCY_HEADERS = {
    "median_ttft_ms": "TTFT p50",
    "p90_ttft_ms": "TTFT p90",
    "p99_ttft_ms": "TTFT p99",
    "p99.9_ttft_ms": "TTFT p99.9",
    "median_e2el_ms": "E2EL p50",
    "p99_e2el_ms": "E2EL p99",
}
# Per output token: a table of its own, as it would not fit 80 columns beside the others.
TOKEN_LATENCY_HEADERS = {
    "median_tpot_ms": "TPOT p50",
    "p90_tpot_ms": "TPOT p90",
    "p99_tpot_ms": "TPOT p99",
    "median_itl_ms": "ITL p50",
    "p90_itl_ms": "ITL p90",
    "p99_itl_ms": "ITL p99",
}
STYLE = {1: "green", -1: "red", 0: ""}


def run_keys(report: Report) -> dict[str, str]:
    """Run label -> A, B, ..., Z, AA, AB, ..."""
    letters = string.ascii_uppercase
    keys = {}
    for i, run in enumerate(report.runs):
        keys[run.label] = letters[i] if i < 26 else letters[i // 26 - 1] + letters[i % 26]
    return keys


def _titled(title: str, *parts: RenderableType) -> Group:
    """A title on a line of its own (a table's own title wraps to the table's width)."""
    return Group(Text(""), Text(title, style="bold"), *parts)


def _number(m: Metric, v: Any) -> str:
    """Narrower than the markdown's: no decimals from 100 up (a terminal has 80 columns)."""
    if cells.missing(v) or m.kind == "count" or abs(float(v)) < 100:
        return cells.value(m, v)
    return f"{float(v):,.0f}"


def _bullets(lines: list[str]) -> Table:
    """A list with a hanging indent."""
    t = Table.grid(padding=(0, 1))
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")
    for line in lines:
        t.add_row("-", line)
    return t


def _heading(text: str) -> Text:
    return Text("\n" + text, style="bold underline")


def _metric(report: Report, m: Metric, row: Any) -> Text:
    """The value, and under it the change against the baseline (coloured better/worse)."""
    text = Text(_number(m, row[m.column]))
    if report.baseline and not row["baseline"]:
        d, pct = row.get(f"{m.column}_delta"), row.get(f"{m.column}_pct")
        if not cells.missing(d):
            count = m.kind == "count" or cells.missing(pct)
            change = (cells.delta(m, d, None) or "") if count else f"{float(pct):+.1f}%"
            text.append("\n" + change, style=STYLE[cells.direction(m, d)])
    return text


def _runs(report: Report, keys: dict[str, str]) -> Iterator[RenderableType]:
    yield _heading("Runs")
    fields = (("source", ""), ("recipe", "recipe "), ("model", "model "), ("precision", ""), ("connector", ""))
    for s in run_summaries(report):
        head = Text(f"{keys[s['run']]}  ", style="bold").append(s["run"], style="cyan")
        if s["baseline"]:
            head.append(" (baseline)", style="bold")
        facts = [f"{prefix}{s[k]}" for k, prefix in fields if s[k] is not None]
        facts += [f"GPUs (P+D) {s['gpus']}"] if s["gpus"] else []
        facts += [f"fingerprint {s['fingerprint']}"] if s["fingerprint"] else []
        facts += [f"state {s['state']}"] if s["state"] else []
        facts += [f"KV {s['kv_transport']}"] if s["kv_transport"] else []
        facts.append(f"{s['points']} point{'' if s['points'] == 1 else 's'}")
        yield head
        yield Padding(Text(" · ".join(facts)), (0, 0, 0, 3))


def _results(report: Report, keys: dict[str, str], width: int) -> Iterator[RenderableType]:
    df = report.table
    yield _heading("Results")
    if df.empty:
        yield Text("No usable result files.")
        return
    shapes = df[["isl", "osl"]].drop_duplicates()
    one_shape = len(shapes) == 1
    if one_shape:
        yield Text(f"ISL {cells.integer(df['isl'].iloc[0])} / OSL {cells.integer(df['osl'].iloc[0])}")
    checked = "outputs" in df.columns
    every = {m.column: m for m in METRICS}
    shown = {m.column for m in (*report.metrics, *report.tail_metrics)}  # percentiles only where some point has them
    latency = [c for c in LATENCY_HEADERS if c in shown]
    token_latency = [c for c in TOKEN_LATENCY_HEADERS if c in shown]
    lead = ["Run"] + ([] if one_shape else ["ISL/OSL"]) + ["Conc"]

    def ids(r: Any) -> list[Any]:
        run = keys[r["run"]] + (" agg" if r["serving"] == "agg" else "")
        shape = [] if one_shape else ["n/a" if cells.missing(r["isl"]) else f"{r['isl']}/{cells.integer(r['osl'])}"]
        return [run, *shape, str(r["conc"])]

    n = len(lead)
    left, right = [False] * (n - 1), [True]  # Run (and shape) left, Conc right
    heads = {  # title -> headers, right-aligned (numeric) or not
        "Points": (
            [*lead, "GPUs (P+D)", "Requests", "Failed", "Valid"] + (["Outputs"] if checked else []),
            left + right + [True, True, True, False] + ([False] if checked else []),
        ),
        "Throughput (tok/s)": ([*lead, *(THROUGHPUT_HEADERS[c] for c in PER_GPU)], left + right * (1 + len(PER_GPU))),
        "Absolute throughput (tok/s)": (
            [*lead, *(THROUGHPUT_HEADERS[c] for c in ABSOLUTE)],
            left + right * (1 + len(ABSOLUTE)),
        ),
        "Latency (ms)": ([*lead, *(LATENCY_HEADERS[c] for c in latency)], left + right * (1 + len(latency))),
        "Latency per output token (ms)": (
            [*lead, *(TOKEN_LATENCY_HEADERS[c] for c in token_latency)],
            left + right * (1 + len(token_latency)),
        ),
    }
    rows: dict[str, list[list[Any]]] = {title: [] for title in heads}
    for _, r in df.iterrows():
        valid = {
            "valid": Text("yes"),
            "invalid": Text("INVALID", style="bold red"),
            "unverified": Text("unverified", style="yellow"),
        }.get(r["verdict"], Text("–"))
        row = [*ids(r), cells.gpus(r), cells.integer(r["requests"]), _metric(report, every["failed"], r), valid]
        if checked:
            row.append("–" if cells.missing(r["outputs"]) else str(r["outputs"]))
        rows["Points"].append(row)
        rows["Throughput (tok/s)"].append([*ids(r), *(_metric(report, every[c], r) for c in PER_GPU)])
        rows["Absolute throughput (tok/s)"].append([*ids(r), *(_metric(report, every[c], r) for c in ABSOLUTE)])
        rows["Latency (ms)"].append([*ids(r), *(_metric(report, every[c], r) for c in latency)])
        rows["Latency per output token (ms)"].append([*ids(r), *(_metric(report, every[c], r) for c in token_latency)])
    tables = {
        title: _titled(title, *fit(headers, numeric, rows[title], width)) for title, (headers, numeric) in heads.items()
    }
    points, tput, absolute, lat, token_lat = tables.values()
    yield points
    yield tput
    yield Text(
        "Per GPU: total over prefill+decode GPUs, output over decode GPUs, input over prefill GPUs. "
        "Per user = 1000 / TPOT p50.",
        style="dim",
    )
    if any(m.column == "total_tput" for m in report.metrics):  # some point's GPU split is unknown
        yield absolute
    yield lat
    yield token_lat
    if report.baseline:
        yield Text(
            f"Changes against the baseline ({keys[report.baseline]}) at the same ISL, OSL and concurrency: "
            "green better, red worse.",
            style="dim",
        )


def _outputs(report: Report, keys: dict[str, str]) -> Iterator[RenderableType]:
    if report.drifts:
        yield _heading("Outputs over the run")
        yield Text(check_text.DRIFT_NOTE, style="dim")
        for d in report.drifts:
            line = Text(f"{keys[d.run]}{' agg' if d.serving == 'agg' else ''}: ", style="bold")
            line.append(check_text.drift_steps(d))
            flag = check_text.drift_flag(d)
            if flag:
                line.append(f" — {flag}", style="bold red")
            yield line
    if report.accuracy:
        yield _heading("Accuracy")
        heads = check_text.ACCURACY_HEADERS
        for r in report.accuracy:
            c = check_text.accuracy_cells(r)
            line = Text(f"{keys[c[0]]}  ", style="bold").append(f"{c[1]}: {c[2]} {c[3]}")
            line.append(f"; {heads[4].lower()} {c[4]}; passed ")
            line.append(c[5], style="bold red" if r.passed is False else "")
            line.append(f"; {heads[6].lower()}: {c[6]}; {heads[7].lower()}: {c[7]}; samples {c[8]}")
            yield line
        yield Text(check_text.ACCURACY_NOTE, style="dim")


def _decisions(report: Report) -> Iterator[RenderableType]:
    if not report.decisions:
        return
    yield _heading("Disaggregated vs aggregated")
    yield _bullets(summary_lines(report.decisions, report.slo))
    for dec in report.decisions:
        t = _rows(_table(RATIO_HEADERS, [False, True, True, True]), ratio_rows(dec))
        yield _titled(f"ISL {dec.isl} / OSL {dec.osl}", t)


def _breakdown(report: Report, keys: dict[str, str], width: int) -> Iterator[RenderableType]:
    if not report.breakdowns:
        return
    yield _heading("Where TTFT goes (medians, ms)")
    heads = breakdown_table.HEADERS
    rows = [[keys[row[0]], *row[1:]] for row in breakdown_table.rows(report)]
    yield from fit(heads, [False, False] + [True] * (len(heads) - 2), rows, width)
    yield Text(
        "Proxy: arrival to first leg sent; Prefill: its queue and compute; KV transfer: the decode "
        "servers' mean over the point; Decode: the rest of the decode leg to its first byte; Client: "
        "the client's TTFT less the proxy's arrival-to-first-byte.",
        style="dim",
    )


def _sections(report: Report, keys: dict[str, str], width: int) -> Iterator[RenderableType]:
    for t in report.sections:
        yield _heading(t.title)
        rows = [[keys.get(row[0], row[0]), *row[1:]] for row in t.rows]
        yield from fit(list(t.headers), t.numeric(), rows, width)
        yield Text(t.note, style="dim")
        if t.findings:
            yield _bullets(list(t.findings))


def renderables(report: Report, width: int = 80) -> Group:
    """The report's parts, each table no wider than `width` (text_fit folds those that would be)."""
    keys = run_keys(report)
    parts: list[RenderableType] = [Text("pdbench report", style="bold")]
    parts += _runs(report, keys)
    parts += _results(report, keys, width)
    parts += _outputs(report, keys)
    parts += _decisions(report)
    parts += _breakdown(report, keys, width)
    parts += _sections(report, keys, width)
    if report.skipped:
        parts.append(_heading(f"Skipped files ({len(report.skipped)})"))
        parts.append(_bullets([f"{report.rel(s.path)}: {s.reason}" for s in report.skipped]))
    if report.notes:
        parts.append(_heading("Notes"))
        parts.append(_bullets(list(report.notes)))
    return Group(*parts)


def render(report: Report, width: int = 80) -> str:
    """Plain text at `width` columns (no colour): `--out report.txt`, and the tests."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False).print(
        renderables(report, width)
    )
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def show(report: Report, console: Console) -> None:
    """Print to a terminal: its width, its colours."""
    console.print(renderables(report, console.width))
