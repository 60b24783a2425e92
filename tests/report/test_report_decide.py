"""`pdbench report` over a disaggregated run and its aggregated baseline: the fronts, the ratios,
the SLO choice, and an HTML page that a real (headless) browser renders with its plots."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from helpers.decide_runs import headless_browser, write_decide_run

from harness.report.build import build_report
from harness.report.decide import decide
from harness.report.slo import SLOError, parse_slo

pytestmark = pytest.mark.timeout(120)


def test_ratios_fronts_and_slo_choice(tmp_path: Path) -> None:
    write_decide_run(tmp_path / "run")
    report = build_report([tmp_path / "run"], slo=parse_slo("ttft_p99=350,tpot_p50=15"))
    assert set(report.table["serving"]) == {"disagg", "agg"} and len(report.table) == 6  # nothing deduplicated
    short, long_ = report.decisions
    assert (short.isl, long_.isl) == (1024, 4096)
    # Interactivity (1000/TPOT) and tok/s/GPU: disagg fronts (50, 300), (100, 100); agg (40, 200),
    # (80, 80). Common range 50..80: at 50, disagg 300 and agg 200 + (80 - 200) * (50 - 40) / 40 = 170;
    # at 80, disagg 300 + (100 - 300) * (80 - 50) / 50 = 180 and agg 80.
    levels = [(x, round(d, 6), round(a, 6)) for x, d, a, _ in short.at_interactivity]
    assert levels == [(50.0, 300.0, 170.0), (80.0, 180.0, 80.0)]
    assert [round(r, 4) for *_, r in short.at_interactivity] == [round(300 / 170, 4), 2.25]
    assert [(c, r) for c, _, _, r in short.at_concurrency] == [(1, 1.25), (4, 1.5)]
    # SLO ttft p99 <= 350 and TPOT p50 <= 15: disagg c1 (100 tok/s/GPU), agg c1 (80); disagg c4
    # has TPOT 20. The best is disagg c1.
    best = short.best["any"]
    assert (best["serving"], best["conc"], best["tput_per_gpu"]) == ("disagg", 1, 100.0)
    assert short.best["agg"]["conc"] == 1
    # The long shape: aggregated wins at c1 (one point each), and only it meets the SLO.
    assert [(c, r) for c, _, _, r in long_.at_concurrency] == [(1, 0.5)]
    assert long_.best["any"]["serving"] == "agg" and long_.best["disagg"] is None
    # Against TTFT p99 (lower is better): disagg's front keeps both of its points.
    assert [(p.x, p.y) for p in short.ttft_fronts["disagg"]] == [(100.0, 100.0), (300.0, 300.0)]


def test_slo_on_a_key_outside_the_table_columns(tmp_path: Path) -> None:
    # TTFT p95 is no column of the table; the SLO's key (harness.config.slo) adds it. Only the
    # short shape's c1 points record it here, so only they can meet it.
    write_decide_run(tmp_path / "run")
    for f in (tmp_path / "run").glob("concurrency_1_*isl_1024*.json"):
        data = json.loads(f.read_text())
        f.write_text(json.dumps(data | {"p95_ttft_ms": 90.0}))
    assert "p95_ttft_ms" not in build_report([tmp_path / "run"]).table.columns
    report = build_report([tmp_path / "run"], slo=parse_slo("ttft_p95=100"))
    assert "p95_ttft_ms" in report.table.columns
    short, long_ = report.decisions
    assert (short.best["any"]["conc"], short.best["any"]["serving"]) == (1, "disagg")
    assert long_.best["any"] is None
    assert not any("p95_ttft_ms" in n for n in report.notes)


def test_invalid_points_stay_off_the_fronts(tmp_path: Path) -> None:
    write_decide_run(tmp_path / "run")
    f = next((tmp_path / "run").glob("concurrency_4_*isl_1024*_gpus_3_ctx_1_gen_2.json"))
    data = json.loads(f.read_text())
    data["metadata"] |= {"valid": False, "validity": {"verdict": "invalid", "valid": False, "reasons": ["x"]}}
    f.write_text(json.dumps(data))
    (short, _) = decide(build_report([tmp_path / "run"]).table)
    assert [p.conc for p in short.fronts["disagg"]] == [1]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("ttft=5", "expected KEY=MS"),
        ("ttft_p99=fast", "not a number"),
        ("ttft_p99=-1", "positive number"),
        ("", "no bound given"),
    ],
)
def test_slo_errors_name_the_key(text: str, needle: str) -> None:
    with pytest.raises(SLOError, match=needle):
        parse_slo(text)


def test_cli_prints_ratios_writes_plots_and_refuses_a_bad_slo(tmp_path: Path) -> None:
    write_decide_run(tmp_path / "run")
    cmd = [sys.executable, "-m", "harness", "report", str(tmp_path / "run")]
    r = subprocess.run(
        [*cmd, "--slo", "ttft_p99=350", "--plot", str(tmp_path / "p.png")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "## Disaggregated vs aggregated" in r.stdout
    assert "ISL 1024 / OSL 100: at equal concurrency, disagg/agg throughput per GPU: c1 1.25x, c4 1.50x" in r.stdout
    assert "best under ttft_p99 <= 350 ms: disagg" in r.stdout
    # Where TTFT went, per point: disagg 1024/100 c4 has TTFT p50 150 = 1 + 75 + 5 + 68 + 1.
    assert "## Where TTFT goes (medians, ms)" in r.stdout
    assert "| run | disagg | 1024 | 100 | 4 | 150.0 | 1.0 | 75.0 | 5.0 | 68.0 | 1.0 |" in r.stdout
    assert "| run | agg | 1024 | 100 | 4 | 250.0 | 1.0 | – | – | 248.0 | 1.0 |" in r.stdout
    for name in ("p.png", "p-ttft.png", "p-isl_1024_osl_100.png", "p-isl_4096_osl_100.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run([*cmd, "--slo", "latency=3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--slo: 'latency=3': expected KEY=MS" in bad.stderr


async def _inspect(port: int) -> dict:
    """What the page shows, through the DevTools protocol: headings, tables, decoded images."""
    probe = """JSON.stringify({
      ready: document.readyState,
      h2: [...document.querySelectorAll('h2')].map(e => e.textContent),
      h3: [...document.querySelectorAll('h3')].map(e => e.textContent),
      images: [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight]),
      findings: [...document.querySelectorAll('#decision + ul li')].map(e => e.textContent),
      cells: [...document.querySelectorAll('td')].length,
    })"""
    async with aiohttp.ClientSession() as s:
        deadline = time.monotonic() + 30
        while True:
            async with s.get(f"http://127.0.0.1:{port}/json/list", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                pages = [t for t in await resp.json() if t["type"] == "page"]
            if pages:
                break
            assert time.monotonic() < deadline, "the browser opened no page"
            await asyncio.sleep(0.2)
        async with s.ws_connect(pages[0]["webSocketDebuggerUrl"], timeout=aiohttp.ClientWSTimeout(ws_close=10)) as ws:
            for i in range(150):
                await ws.send_json({"id": i, "method": "Runtime.evaluate", "params": {"expression": probe}})
                while (msg := await asyncio.wait_for(ws.receive_json(), 10)).get("id") != i:
                    pass
                seen = json.loads(msg["result"]["result"]["value"])
                if seen["ready"] == "complete" and seen["images"] and all(c for c, *_ in seen["images"]):
                    return seen
                await asyncio.sleep(0.2)
    raise AssertionError(f"the page never finished loading: {seen}")


def test_html_report_renders_in_a_headless_browser(tmp_path: Path) -> None:
    write_decide_run(tmp_path / "run")
    page = tmp_path / "report.html"
    r = subprocess.run(
        [sys.executable, "-m", "harness", "report", str(tmp_path / "run"), "-f", "html", "--out", str(page)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    browser = subprocess.Popen(
        [
            headless_browser(),
            "--headless=new",
            "--no-sandbox",  # as root, in a container
            "--disable-gpu",
            "--remote-debugging-port=0",
            f"--user-data-dir={tmp_path / 'profile'}",
            page.as_uri(),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = None
        deadline = time.monotonic() + 60
        assert browser.stderr is not None
        while port is None and time.monotonic() < deadline:
            line = browser.stderr.readline()
            if m := re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line):
                port = int(m[1])
            elif not line and browser.poll() is not None:
                break
        assert port is not None, f"the browser did not start (exit {browser.poll()})"
        seen = asyncio.run(_inspect(port))
    finally:
        browser.terminate()
        try:
            browser.wait(15)
        except subprocess.TimeoutExpired:
            browser.kill()
            browser.wait(5)
    assert "Disaggregated vs aggregated" in seen["h2"]
    assert seen["h3"] == ["Latency percentiles (ms)", "ISL 1024 / OSL 100", "ISL 4096 / OSL 100"]
    # The throughput-vs-interactivity chart (900 x 600 px), both Pareto plots (1200 x 500 px
    # figures) and the TTFT bars, each decoded to a real image.
    assert [img[1:] for img in seen["images"]][:3] == [[900, 600], [1200, 500], [1200, 500]]
    assert len(seen["images"]) == 4 and seen["images"][3][1] == 1000
    assert "Where TTFT goes" in seen["h2"]
    assert any("at equal concurrency" in f and "c4 1.50x" in f for f in seen["findings"])
    assert seen["cells"] > 6 * 10
