"""The disaggregated-vs-aggregated decision in words and as ratio rows (markdown, HTML, console)."""

from __future__ import annotations

from harness.report.model import ShapeDecision

RATIO_HEADERS = ["At", "Disagg tok/s/GPU", "Agg tok/s/GPU", "Disagg/agg"]


def summary_lines(decisions: list[ShapeDecision], slo: dict[str, float] | None) -> list[str]:
    """The answer in words, one line per finding."""
    lines: list[str] = []
    for dec in decisions:
        head = f"ISL {dec.isl} / OSL {dec.osl}"
        if dec.at_interactivity:
            ratios = [r for *_, r in dec.at_interactivity]
            lines.append(
                f"{head}: at equal interactivity, disagg/agg throughput per GPU is {min(ratios):.2f}x to "
                f"{max(ratios):.2f}x over {dec.at_interactivity[0][0]:.1f}-{dec.at_interactivity[-1][0]:.1f} tok/s/user"
            )
        else:
            lines.append(f"{head}: the two fronts reach no common interactivity level (see the per-concurrency ratios)")
        if dec.at_concurrency:
            text = ", ".join(f"c{c} {r:.2f}x" for c, _, _, r in dec.at_concurrency)
            lines.append(f"{head}: at equal concurrency, disagg/agg throughput per GPU: {text}")
        if slo:
            bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items())
            best = dec.best.get("any")
            if best is None:
                lines.append(f"{head}: no valid point meets {bounds}")
            else:
                lines.append(
                    f"{head}: best under {bounds}: {best['serving']} {best['run']} at c{best['conc']}, "
                    f"{best['tput_per_gpu']:.1f} tok/s/GPU" + _other(dec, best["serving"])
                )
    return lines


def _other(dec: ShapeDecision, kind: str) -> str:
    other = "agg" if kind == "disagg" else "disagg"
    row = dec.best.get(other)
    if row is None:
        return f" (no {other} point meets it)"
    return f" ({other} best: {row['tput_per_gpu']:.1f} tok/s/GPU at c{row['conc']})"


def ratio_rows(dec: ShapeDecision) -> list[list[str]]:
    """Table rows: where, disagg tok/s/GPU, agg tok/s/GPU, ratio."""
    rows = [[f"{x:.1f} tok/s/user", f"{d:.1f}", f"{a:.1f}", f"{r:.2f}x"] for x, d, a, r in dec.at_interactivity]
    rows += [[f"c{c}", f"{d:.1f}", f"{a:.1f}", f"{r:.2f}x"] for c, d, a, r in dec.at_concurrency]
    return rows
