"""GitHub-flavoured markdown: runs, results (with deltas against the baseline), skipped files, notes."""

from __future__ import annotations

from typing import Any

from harness.report import breakdown_table, cells, check_text
from harness.report.decision_text import RATIO_HEADERS, ratio_rows, summary_lines
from harness.report.model import ABSOLUTE, Metric, Report
from harness.report.run_summary import run_summaries

RIGHT = "---:"


def _esc(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], align: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _metric(report: Report, m: Metric, r: Any) -> str:
    """The value, and its change against the baseline in brackets."""
    text = cells.value(m, r[m.column])
    if report.baseline and not r["baseline"]:
        d = cells.delta(m, r.get(f"{m.column}_delta"), r.get(f"{m.column}_pct"))
        if d is not None:
            text += f" ({d})"
    return text


def _valid(row: Any) -> str:
    return {"valid": "yes", "invalid": "⚠️ **INVALID**", "unverified": "unverified"}.get(row["verdict"], "–")


def _decision(report: Report) -> list[str]:
    if not report.decisions:
        return []
    out = ["## Disaggregated vs aggregated", ""]
    out += [f"- {_esc(line)}" for line in summary_lines(report.decisions, report.slo)] + [""]
    for dec in report.decisions:
        out += [f"### ISL {dec.isl} / OSL {dec.osl}", ""]
        out += [*_table(RATIO_HEADERS, ["---", RIGHT, RIGHT, RIGHT], ratio_rows(dec)), ""]
    return out


def _breakdown(report: Report) -> list[str]:
    if not report.breakdowns:
        return []
    out = ["## Where TTFT goes (medians, ms)", ""]
    headers, body = breakdown_table.HEADERS, [[_esc(c) for c in r] for r in breakdown_table.rows(report)]
    out += _table(headers, ["---", "---"] + [RIGHT] * (len(headers) - 2), body)
    out += [
        "",
        "Proxy: arrival to first leg sent; Prefill: its queue and compute; KV transfer: the decode "
        "servers' mean over the point; Decode: the rest of the decode leg to its first byte; Client: "
        "the client's TTFT less the proxy's arrival-to-first-byte.",
        "",
    ]
    return out


def _sections(report: Report) -> list[str]:
    out: list[str] = []
    for t in report.sections:
        out += [f"## {t.title}", ""]
        align = [RIGHT if num else "---" for num in t.numeric()]
        out += _table(list(t.headers), align, [[_esc(c) for c in r] for r in t.rows])
        out += ["", _esc(t.note), ""]
        if t.findings:
            out += [f"- ⚠️ {_esc(f)}" for f in t.findings] + [""]
    return out


def _outputs(report: Report) -> list[str]:
    """Each run's sentinel match in sweep order, then the accuracy evals."""
    out: list[str] = []
    if report.drifts:
        out += ["## Outputs over the run", "", check_text.DRIFT_NOTE, ""]
        for d in report.drifts:
            flag = check_text.drift_flag(d)
            line = f"- `{_esc(check_text.drift_label(d))}`: {_esc(check_text.drift_steps(d))}"
            out.append(line + (f" — ⚠️ **{_esc(flag)}**" if flag else ""))
        out.append("")
    if report.accuracy:
        out += ["## Accuracy", ""]
        body = [[_esc(c) for c in check_text.accuracy_cells(r)] for r in report.accuracy]
        body = [[f"`{r[0]}`", *r[1:5], "⚠️ **NO**" if r[5] == "NO" else r[5], *r[6:]] for r in body]
        headers = check_text.ACCURACY_HEADERS
        out += _table(headers, ["---", "---", "---", RIGHT, RIGHT, "---", RIGHT, RIGHT, RIGHT], body)
        out += ["", check_text.ACCURACY_NOTE, ""]
    return out


def render(report: Report) -> str:
    out = ["# pdbench report", ""]
    if report.baseline:
        out += [
            f"**Baseline:** `{report.baseline}`. Other rows show value (change, % change) against the "
            "baseline row of the same ISL, OSL and concurrency. Higher is better for throughput and "
            "interactivity, lower for latencies and failed requests.",
            "",
        ]
    out += ["## Runs", ""]
    rows = []
    for s in run_summaries(report):
        label = f"`{_esc(s['run'])}`" + (" (baseline)" if s["baseline"] else "")
        rows.append(
            [label]
            + [
                _esc(s[k]) if s[k] is not None else "–"
                for k in ("source", "recipe", "model", "precision", "connector", "gpus", "fingerprint")
            ]
            + [_esc("; ".join(v for v in (s["state"], s["kv_transport"] and f"KV {s['kv_transport']}") if v) or "–")]
            + [str(s["points"])]
        )
    out += _table(
        ["Run", "Source", "Recipe", "Model", "Precision", "Connector", "GPUs (P+D)", "Fingerprint", "State", "Points"],
        ["---"] * 6 + [RIGHT, "---", "---", RIGHT],
        rows,
    )
    out += ["", "## Results", ""]
    df = report.table
    if df.empty:
        out += ["No usable result files.", ""]
    else:
        checked = "outputs" in df.columns  # only when some point checked its outputs
        absolute = any(m.column in ABSOLUTE for m in report.metrics)
        header = ["Run", "ISL", "OSL", "Conc", "Requests", "GPUs (P+D)", "Valid"] + (["Outputs"] if checked else [])
        header += [m.header for m in report.metrics]
        align = (
            ["---", RIGHT, RIGHT, RIGHT, RIGHT, RIGHT, "---"]
            + (["---"] if checked else [])
            + [RIGHT] * len(report.metrics)
        )
        body = []
        for _, r in df.iterrows():
            label = f"`{_esc(r['run'])}`" + (" (baseline)" if r["baseline"] else "") + cells.serving(r)
            line = [label, cells.integer(r["isl"]), cells.integer(r["osl"]), str(r["conc"])]
            line += [cells.integer(r["requests"]), cells.gpus(r), _valid(r)]
            if checked:
                line.append(_esc(r["outputs"]) if not cells.missing(r["outputs"]) else "–")
            line += [_metric(report, m, r) for m in report.metrics]
            body.append(line)
        out += _table(header, align, body)
        out += [
            "",
            "Per-GPU throughput: total over prefill+decode GPUs, output over decode GPUs, input over "
            "prefill GPUs. Interactivity = 1000 / median TPOT (ms)."
            + (" Total and output tok/s: absolute, for the points whose GPU split is unknown." if absolute else ""),
            "",
        ]
        if report.tail_metrics:  # a table of their own: the one above is wide enough
            out += ["### Latency percentiles (ms)", ""]
            tail = report.tail_metrics
            rows = [
                [
                    f"`{_esc(r['run'])}`" + cells.serving(r),
                    cells.integer(r["isl"]),
                    cells.integer(r["osl"]),
                    str(r["conc"]),
                ]
                + [_metric(report, m, r) for m in tail]
                for _, r in df.iterrows()
            ]
            out += _table(
                ["Run", "ISL", "OSL", "Conc", *(m.header for m in tail)], ["---"] + [RIGHT] * (3 + len(tail)), rows
            )
            out += [""]
    out += _outputs(report)
    out += _decision(report)
    out += _breakdown(report)
    out += _sections(report)
    if report.skipped:
        out += [f"## Skipped files ({len(report.skipped)})", ""]
        out += [f"- `{_esc(report.rel(s.path))}`: {_esc(s.reason)}" for s in report.skipped]
        out += [""]
    if report.notes:
        out += ["## Notes", ""]
        out += [f"- {_esc(n)}" for n in report.notes]
        out += [""]
    return "\n".join(out).rstrip("\n") + "\n"
