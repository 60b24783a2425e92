"""The report's plots as a user meets them: the HTML page has the throughput-vs-interactivity chart
(output tok/s per GPU against tok/s per user) for one run, the TTFT bars' legend hides no bar, and
`--plot` never writes over a file (as `--out`)."""

from __future__ import annotations

import base64
import json
import re
import struct
from pathlib import Path

import pytest
from helpers.cli_run import pdbench
from helpers.decide_runs import write_decide_run

from harness.report import breakdown_plot, pareto_plot
from harness.report.build import build_report

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests" / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
pytestmark = pytest.mark.timeout(120)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return struct.unpack(">II", data[16:24])


def test_one_runs_html_has_the_throughput_interactivity_chart(tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    r = pdbench("report", str(RUN), "--out", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    # Precondition: one run, one serving kind: no disaggregated-vs-aggregated plot to lean on.
    assert 'id="decision"' not in html
    assert '<h2 id="tradeoff">Throughput vs interactivity</h2>' in html, html[:2000]
    (data,) = re.findall(r'alt="Output tok/s per GPU vs tok/s per user" src="data:image/png;base64,([^"]+)"', html)
    assert _png_size(base64.b64decode(data)) == (900, 600)

    # The chart places each point at its result's output tok/s over the decode GPUs and 1000 / TPOT p50.
    ax = pareto_plot.figure(build_report([RUN]), "output_tput_per_gpu").axes[0]
    placed = sorted((round(x, 3), round(y, 3)) for line in ax.lines for x, y in line.get_xydata())
    points = [json.loads(p.read_text()) for p in RUN.glob("concurrency_*.json")]
    want = sorted(
        (round(1000 / d["median_tpot_ms"], 3), round(d["output_throughput"] / d["metadata"]["decode_gpus"], 3))
        for d in points
    )
    assert placed == want and len(want) == 2, (placed, want)
    assert ax.get_ylabel() == "Output throughput per decode GPU (tok/s/GPU)"


def test_the_ttft_bars_legend_covers_no_bar(tmp_path: Path) -> None:
    write_decide_run(tmp_path / "run")
    report = build_report([tmp_path / "run"])
    assert len(report.breakdowns) == 6  # precondition: a bar per point
    fig = breakdown_plot.figure(report)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches if p.get_width() > 0]
    assert len(bars) >= 6
    assert not [b for b in bars if b.overlaps(legend)], "the legend covers bars"
    whole = fig.bbox
    assert whole.x0 <= legend.x0 and legend.x1 <= whole.x1, (legend, whole)  # and is on the page


def test_plot_never_writes_over_a_file(tmp_path: Path) -> None:
    write_decide_run(tmp_path / "run")
    png = tmp_path / "p.png"
    r = pdbench("report", str(tmp_path / "run"), "--plot", str(png))
    assert r.returncode == 0 and _png_size(png.read_bytes()), r.stderr  # the run does make plots
    made = sorted(p.name for p in tmp_path.glob("p*.png"))
    assert made == ["p-isl_1024_osl_100.png", "p-isl_4096_osl_100.png", "p-ttft.png", "p.png"], made

    png.write_text("someone's chart\n")
    r = pdbench("report", str(tmp_path / "run"), "--plot", str(png))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: {png} exists; report never overwrites (choose another --plot)", r.stderr
    assert png.read_text() == "someone's chart\n"

    # One of the plots written beside it exists: refused before anything is written, --out included.
    png.unlink()
    extra = tmp_path / "p-ttft.png"
    extra.write_text("kept\n")
    out = tmp_path / "r.md"
    r = pdbench("report", str(tmp_path / "run"), "--plot", str(png), "--out", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: {extra} exists; report never overwrites (choose another --plot)", r.stderr
    assert extra.read_text() == "kept\n" and not png.exists() and not out.exists()
