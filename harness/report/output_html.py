"""A self-contained HTML page: the same sections as the markdown, invalid rows highlighted and
deltas coloured by whether they are better or worse."""

from __future__ import annotations

import base64
import html
import re
from typing import Any

from harness.report import breakdown_plot, breakdown_table, cells, check_text, decision_plot, pareto_plot
from harness.report.decision_text import RATIO_HEADERS, ratio_rows, summary_lines
from harness.report.model import ABSOLUTE, Metric, Report
from harness.report.run_summary import run_summaries

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1em 1.5em; color: #1f2328; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; }
th { background: #f6f8fa; }
td.num { text-align: right; white-space: nowrap; }
table.results, table.percentiles { font-size: 0.75em; }
table.results th, table.percentiles th { padding: 3px 4px; }
table.results td, table.percentiles td { padding: 3px 4px; }
td.run { overflow-wrap: anywhere; min-width: 8em; }
tr.baseline td { background: #f6f8fa; }
tr.invalid td { background: #ffebe9; }
.invalid-flag { color: #cf222e; font-weight: bold; }
.unverified-flag { color: #9a6700; }
.better { color: #1a7f37; }
.worse { color: #cf222e; }
code { background: #f6f8fa; padding: 0 3px; }
img.plot { max-width: 100%; }
""".strip()


def _text(s: Any) -> str:
    """Escape, then show `code` spans as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(str(s)))


def _breakable(text: str) -> str:
    """Escaped, with a line-break opportunity after each / (headers like tok/s/decode GPU) and in
    the longest header word."""
    return html.escape(text).replace("/", "/<wbr>").replace("Interactivity", "Inter&shy;activity")


def _cell(text: str, num: bool = False) -> str:
    return f'<td class="num">{text}</td>' if num else f"<td>{text}</td>"


def _decision(report: Report) -> list[str]:
    """The disagg/agg answer: findings, then per shape both Pareto plots (inline PNG) and the ratios."""
    if not report.decisions:
        return []
    out = ['<h2 id="decision">Disaggregated vs aggregated</h2>', "<ul>"]
    out += [f"<li>{_text(line)}</li>" for line in summary_lines(report.decisions, report.slo)]
    out.append("</ul>")
    for dec in report.decisions:
        data = base64.b64encode(decision_plot.png(dec)).decode()
        title = f"ISL {dec.isl} / OSL {dec.osl}"
        out += [
            f'<h3 id="{dec.tag}">{title}</h3>',
            f'<img class="plot" alt="Pareto fronts, {title}" src="data:image/png;base64,{data}">',
            "<table>",
            "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in RATIO_HEADERS) + "</tr></thead>",
            "<tbody>",
        ]
        for row in ratio_rows(dec):
            out.append(
                "<tr>" + _cell(html.escape(row[0])) + "".join(_cell(html.escape(v), True) for v in row[1:]) + "</tr>"
            )
        out += ["</tbody>", "</table>"]
    return out


def _metric(report: Report, m: Metric, r: Any) -> str:
    """The value, and under it its change against the baseline, coloured better or worse."""
    text = html.escape(cells.value(m, r[m.column]))
    if report.baseline and not r["baseline"]:
        d = cells.delta(m, r.get(f"{m.column}_delta"), r.get(f"{m.column}_pct"))
        if d is not None:
            way = {1: "better", -1: "worse", 0: "same"}[cells.direction(m, r.get(f"{m.column}_delta"))]
            change = "<br>".join(html.escape(part) for part in d.split(", "))
            text += f'<br><span class="{way}">{change}</span>'
    return text


def _tail(report: Report) -> list[str]:
    """The optional latency percentiles some point has, in a table of their own (the results
    table keeps to a 1400 px window)."""
    tail = report.tail_metrics
    if not tail:
        return []
    heads = ["Run", "ISL", "OSL", "Conc", *(m.header for m in tail)]
    out = [
        '<h3 id="latency-percentiles">Latency percentiles (ms)</h3>',
        '<table class="percentiles">',
        "<thead><tr>" + "".join(f"<th>{_breakable(h)}</th>" for h in heads) + "</tr></thead>",
        "<tbody>",
    ]
    for _, r in report.table.iterrows():
        label = f"<code>{_breakable(r['run'])}</code>" + cells.serving(r)
        tds = [f'<td class="run">{label}</td>']
        tds += [_cell(cells.integer(r["isl"]), True), _cell(cells.integer(r["osl"]), True), _cell(str(r["conc"]), True)]
        tds += [_cell(_metric(report, m, r), True) for m in tail]
        out.append("<tr>" + "".join(tds) + "</tr>")
    return [*out, "</tbody>", "</table>"]


def _tradeoff(report: Report) -> list[str]:
    """Output tok/s per GPU against tok/s per user, InferenceX's chart: for one run too (the
    disaggregated-vs-aggregated plots need both kinds)."""
    y = "output_tput_per_gpu"
    if not pareto_plot.plottable(report, y):
        return []
    data = base64.b64encode(pareto_plot.png(report, y)).decode()
    return [
        '<h2 id="tradeoff">Throughput vs interactivity</h2>',
        f'<img class="plot" alt="Output tok/s per GPU vs tok/s per user" src="data:image/png;base64,{data}">',
        "<p>Each line joins a sweep's Pareto-optimal points (labelled by concurrency); faded points are "
        "dominated, crosses invalid. Output tok/s over the decode GPUs; tok/s per user = 1000 / median "
        "TPOT (ms).</p>",
    ]


def _breakdown(report: Report) -> list[str]:
    if not report.breakdowns:
        return []
    data = base64.b64encode(breakdown_plot.png(report)).decode()
    out = [
        '<h2 id="ttft-breakdown">Where TTFT goes</h2>',
        f'<img class="plot" alt="TTFT breakdown per point" src="data:image/png;base64,{data}">',
        "<table>",
        "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in breakdown_table.HEADERS) + "</tr></thead>",
        "<tbody>",
    ]
    for row in breakdown_table.rows(report):
        cells_ = [_cell(f"<code>{html.escape(row[0])}</code>"), _cell(html.escape(row[1]))]
        out.append("<tr>" + "".join(cells_ + [_cell(html.escape(v), True) for v in row[2:]]) + "</tr>")
    out += [
        "</tbody>",
        "</table>",
        "<p>Medians in ms. Proxy: arrival to first leg sent; Prefill: its queue and compute; KV transfer: "
        "the connector's mean over the point (decode's reads; prefill's writes for NIXL push); Decode: the rest of "
        "the decode leg to its first byte; "
        "Client: the client's TTFT less the proxy's arrival-to-first-byte.</p>",
    ]
    return out


def _sections(report: Report) -> list[str]:
    out: list[str] = []
    for t in report.sections:
        out += [
            f"<h2>{html.escape(t.title)}</h2>",
            "<table>",
            "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in t.headers) + "</tr></thead>",
            "<tbody>",
        ]
        numeric = t.numeric()
        for row in t.rows:
            cells_ = [_cell(f"<code>{html.escape(row[0])}</code>"), _cell(html.escape(row[1]))]
            rest = [_cell(html.escape(v), num) for v, num in zip(row[2:], numeric[2:], strict=True)]
            out.append("<tr>" + "".join(cells_ + rest) + "</tr>")
        out += ["</tbody>", "</table>", f"<p>{html.escape(t.note)}</p>"]
        if t.findings:
            out += ["<ul>", *(f"<li>⚠️ {html.escape(f)}</li>" for f in t.findings), "</ul>"]
    return out


def _outputs(report: Report) -> list[str]:
    """Each run's sentinel match in sweep order, then the accuracy evals."""
    out: list[str] = []
    if report.drifts:
        out += ['<h2 id="outputs">Outputs over the run</h2>', f"<p>{html.escape(check_text.DRIFT_NOTE)}</p>", "<ul>"]
        for d in report.drifts:
            flag = check_text.drift_flag(d)
            line = (
                f"<li><code>{html.escape(check_text.drift_label(d))}</code>: {html.escape(check_text.drift_steps(d))}"
            )
            out.append(line + (f' — <span class="invalid-flag">{html.escape(flag)}</span>' if flag else "") + "</li>")
        out.append("</ul>")
    if report.accuracy:
        out += [
            '<h2 id="accuracy">Accuracy</h2>',
            "<table>",
            "<thead><tr>"
            + "".join(f"<th>{html.escape(h)}</th>" for h in check_text.ACCURACY_HEADERS)
            + "</tr></thead>",
            "<tbody>",
        ]
        for r in report.accuracy:
            c = [html.escape(v) for v in check_text.accuracy_cells(r)]
            passed = '<span class="invalid-flag">NO</span>' if r.passed is False else c[5]
            tds = [_cell(f"<code>{c[0]}</code>"), _cell(c[1]), _cell(c[2]), _cell(c[3], True), _cell(c[4], True)]
            tds += [_cell(passed), _cell(c[6], True), _cell(c[7], True), _cell(c[8], True)]
            out.append(('<tr class="invalid">' if r.passed is False else "<tr>") + "".join(tds) + "</tr>")
        out += ["</tbody>", "</table>", f"<p>{html.escape(check_text.ACCURACY_NOTE)}</p>"]
    return out


def render(report: Report) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        "<title>pdbench report</title>",
        f"<style>\n{STYLE}\n</style>",
        "</head>",
        "<body>",
        "<h1>pdbench report</h1>",
    ]
    if report.baseline:
        out.append(
            f"<p><strong>Baseline:</strong> <code>{html.escape(report.baseline)}</code>. Other rows show "
            "under each value its change and % change against the baseline row of the same ISL, OSL and concurrency; "
            '<span class="better">green</span> is better, <span class="worse">red</span> is worse.</p>'
        )
    out += [
        "<h2>Runs</h2>",
        "<table>",
        "<thead><tr>"
        + "".join(
            f"<th>{h}</th>"
            for h in (
                "Run",
                "Source",
                "Recipe",
                "Model",
                "Precision",
                "Connector",
                "GPUs (P+D)",
                "Fingerprint",
                "State",
                "Points",
            )
        )
        + "</tr></thead>",
        "<tbody>",
    ]
    for s in run_summaries(report):
        label = f"<code>{html.escape(s['run'])}</code>" + (" (baseline)" if s["baseline"] else "")
        tds = [_cell(label)] + [
            _cell(html.escape(str(s[k])) if s[k] is not None else "–")
            for k in ("source", "recipe", "model", "precision", "connector")
        ]
        tds += [_cell(html.escape(str(s["gpus"] or "–")), True)]
        state = "; ".join(v for v in (s["state"], s["kv_transport"] and f"KV {s['kv_transport']}") if v)
        tds += [_cell(html.escape(str(s["fingerprint"])) if s["fingerprint"] is not None else "–")]
        tds += [_cell(html.escape(state) if state else "–")]
        tds += [_cell(str(s["points"]), True)]
        out.append("<tr>" + "".join(tds) + "</tr>")
    out += ["</tbody>", "</table>", "<h2>Results</h2>"]
    df = report.table
    if df.empty:
        out.append("<p>No usable result files.</p>")
    else:
        checked = "outputs" in df.columns  # only when some point checked its outputs
        heads = ["Run", "ISL", "OSL", "Conc", "Requests", "GPUs (P+D)", "Valid"] + (["Outputs"] if checked else [])
        heads += [m.header for m in report.metrics]
        out += [
            # Fits a 1400 px window: small type, headers that break after each /, the change on lines of its own.
            '<table class="results">',
            "<thead><tr>" + "".join(f"<th>{_breakable(h)}</th>" for h in heads) + "</tr></thead>",
            "<tbody>",
        ]
        for _, r in df.iterrows():
            invalid = not cells.missing(r["valid"]) and not r["valid"]
            cls = " ".join(c for c, on in (("baseline", r["baseline"]), ("invalid", invalid)) if on)
            label = f"<code>{_breakable(r['run'])}</code>" + (" (baseline)" if r["baseline"] else "") + cells.serving(r)
            valid = {
                "valid": "yes",
                "invalid": '<span class="invalid-flag">INVALID</span>',
                "unverified": '<span class="unverified-flag">unverified</span>',
            }.get(r["verdict"], "–")
            tds = [
                f'<td class="run">{label}</td>',
                _cell(cells.integer(r["isl"]), True),
                _cell(cells.integer(r["osl"]), True),
                _cell(str(r["conc"]), True),
                _cell(cells.integer(r["requests"]), True),
                _cell(cells.gpus(r), True),
                _cell(valid),
            ]
            if checked:
                tds.append(_cell(html.escape(r["outputs"]) if not cells.missing(r["outputs"]) else "–"))
            tds += [_cell(_metric(report, m, r), True) for m in report.metrics]
            out.append(f'<tr class="{cls}">' + "".join(tds) + "</tr>" if cls else "<tr>" + "".join(tds) + "</tr>")
        out += [
            "</tbody>",
            "</table>",
            "<p>Per-GPU throughput: total over prefill+decode GPUs, output over decode GPUs, input over "
            "prefill GPUs. Interactivity = 1000 / median TPOT (ms)."
            + (
                " Total and output tok/s: absolute, for the points whose GPU split is unknown."
                if any(m.column in ABSOLUTE for m in report.metrics)
                else ""
            )
            + "</p>",
        ]
        out += _tail(report)
    out += _tradeoff(report)
    out += _outputs(report)
    out += _decision(report)
    out += _breakdown(report)
    out += _sections(report)
    if report.skipped:
        out += [f"<h2>Skipped files ({len(report.skipped)})</h2>", "<ul>"]
        out += [f"<li><code>{html.escape(report.rel(s.path))}</code>: {_text(s.reason)}</li>" for s in report.skipped]
        out.append("</ul>")
    if report.notes:
        out += ["<h2>Notes</h2>", "<ul>"] + [f"<li>{_text(n)}</li>" for n in report.notes] + ["</ul>"]
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"
