"""`pdbench report` and `collect` as a user runs them: tables at 80 columns in a terminal (a pty),
markdown through a pipe, the format from --out, the same data in every format, --slo, --plot,
--label, an HTML page that fits a 1400 px window, and `collect` saying once what it needs."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.decide_runs import headless_browser, write_decide_run
from helpers.outputs_check_runs import outputs_check_run, write_eval_summary

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "results"
TINY_1P1D = FIXTURES / "tiny-fp32-cpu-nixl-1p1d/20261122T032441Z-e8da34"
TINY_1P2D = FIXTURES / "tiny-fp32-cpu-nixl-1p2d/20261122T034324Z-a3eb41"
DSR1_A = FIXTURES / "dsr1-fp8-2p4d/20261201T100000Z-aaa111"
DSR1_B = FIXTURES / "dsr1-fp8-2p4d/20261202T100000Z-bbb222"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "RUNNER_TYPE", "NO_COLOR")}
    return env | {"TERM": "xterm-256color"} | extra


def _in_terminal(*args: str, columns: int = 80, timeout: float = 120) -> tuple[int, str, str]:
    """Run `pdbench ARGS` with stdout and stderr on a pty of `columns` columns: (exit, raw, text
    without colour codes and carriage returns)."""
    master, slave = pty.openpty()
    import fcntl
    import termios

    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args], stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=_env()
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            assert time.monotonic() < deadline, "pdbench did not finish in time"
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
    raw = b"".join(chunks).decode()
    return rc, raw, ANSI.sub("", raw).replace("\r", "")


def _pdbench(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=_env(**env),
    )


def _flat(text: str) -> str:
    """Text with its wrapping undone: words separated by single spaces."""
    return " ".join(text.split())


# --- a terminal, a pipe, a file ---------------------------------------------------------------------


def test_a_terminal_gets_tables_that_fit_80_columns() -> None:
    rc, raw, text = _in_terminal("report", str(TINY_1P2D), "--baseline", str(TINY_1P1D))
    assert rc == 0, text
    assert "\x1b[" in raw  # precondition: the terminal renderer ran (colours), not markdown
    lines = [line.rstrip() for line in text.splitlines()]
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "|---" not in text and "<html" not in text
    for title in ("Runs", "Points", "Throughput (tok/s)", "Latency (ms)", "Notes"):
        assert title in lines, title
    # Runs by letter, the baseline named; the requests per point; numbers whole on one line.
    assert "A  tiny-fp32-cpu-nixl-1p1d/20261122T032441Z-e8da34 (baseline)" in lines
    points = next(line for line in lines if line.startswith("B") and line.split()[1:2] == ["4"])
    assert points.split()[:5] == ["B", "4", "1+2", "16", "0"]  # run, conc, GPUs, requests, failed
    latency = [line for line in lines if line.startswith("B       1 ")]
    assert any(line.split()[-1] == "2,742" for line in latency)  # E2EL p99 of B at conc 1
    assert "+645.8%" in text  # its change against the baseline


def test_html_is_not_written_to_a_terminal() -> None:
    rc, _, text = _in_terminal("report", str(TINY_1P1D), "--format", "html")
    assert rc == 2
    assert "--format html: not written to a terminal" in text and "--out report.html" in text
    assert "<!DOCTYPE" not in text and "Traceback" not in text


def test_a_pipe_gets_markdown_and_format_text_gets_tables() -> None:
    r = _pdbench("report", str(TINY_1P1D))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# pdbench report\n") and "| Run | ISL | OSL | Conc | Requests |" in r.stdout
    r = _pdbench("report", str(TINY_1P1D), "--format", "text", COLUMNS="80")
    assert r.returncode == 0, r.stderr
    assert "Throughput (tok/s)" in r.stdout and max(len(x) for x in r.stdout.splitlines()) <= 80


def test_the_format_comes_from_the_out_extension(tmp_path: Path) -> None:
    for ext, start in ((".json", "{"), (".csv", "run,"), (".html", "<!DOCTYPE html>"), (".md", "# pdbench")):
        out = tmp_path / f"r{ext}"
        r = _pdbench("report", str(TINY_1P1D), "--out", str(out))
        assert r.returncode == 0, r.stderr
        assert out.read_text().startswith(start), ext
    r = _pdbench("report", str(TINY_1P1D), "--out", str(tmp_path / "r.json"), "--format", "md")
    assert r.returncode == 2 and "names a json file but --format is md" in r.stderr
    r = _pdbench("report", str(TINY_1P1D), "--out", str(tmp_path / "r.pdf"))
    assert r.returncode == 2 and "no format for the extension '.pdf'" in r.stderr
    assert not (tmp_path / "r.pdf").exists()


# --- the same data in every format ------------------------------------------------------------------


def test_csv_and_json_carry_the_ttft_breakdown_and_the_decision(tmp_path: Path) -> None:
    write_decide_run(tmp_path / "run")
    r = _pdbench("report", str(tmp_path / "run"), "--out", str(tmp_path / "r.csv"))
    assert r.returncode == 0, r.stderr
    rows = {
        (x["serving"], x["isl"], x["conc"]): x for x in csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text()))
    }
    # disagg 1024/100 c4: TTFT p50 150 = proxy 1 + prefill 75 + KV 5 + decode 68 + client 1 (as markdown says).
    d = rows[("disagg", "1024", "4")]
    parts = ("ttft_proxy_ms", "ttft_prefill_ms", "ttft_kv_transfer_ms", "ttft_decode_ms", "ttft_client_ms")
    assert [float(d[k]) for k in parts] == [1.0, 75.0, 5.0, 68.0, 1.0] and d["ttft_breakdown_requests"] == "1"
    a = rows[("agg", "1024", "4")]
    assert (a["ttft_prefill_ms"], a["ttft_kv_transfer_ms"], a["ttft_decode_ms"]) == ("", "", "248.0")
    r = _pdbench("report", str(tmp_path / "run"), "--out", str(tmp_path / "r.json"), "--slo", "ttft_p99=350")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    row = next(x for x in doc["rows"] if (x["serving"], x["isl"], x["conc"]) == ("disagg", 1024, 4))
    assert [row[k] for k in parts] == [1.0, 75.0, 5.0, 68.0, 1.0]
    assert doc["slo"] == {"ttft_p99": 350.0}
    short = next(x for x in doc["decisions"] if x["isl"] == 1024)
    assert [(c["conc"], c["ratio"]) for c in short["at_concurrency"]] == [(1, 1.25), (4, 1.5)]
    assert short["best"]["any"]["serving"] == "disagg"


def test_output_checks_show_in_the_terminal_format(tmp_path: Path) -> None:
    run = outputs_check_run(tmp_path)
    write_eval_summary(run, "disagg", "after", 0.41, 0.0121)
    r = _pdbench("report", str(run), "--format", "text", COLUMNS="80")
    assert r.returncode == 0, r.stderr
    text = _flat(r.stdout)
    assert "Outputs over the run" in text and "falling: 100% at conc 256 to 75% at conc 128" in text
    assert "3/4 (first divergence at token 17)" in text  # the points table's Outputs column
    assert "Accuracy" in text and "gsm8k (exact_match,strict-match) 0.4100 ± 0.0121" in text
    assert "passed NO" in text


def test_absolute_throughput_when_the_gpu_split_is_unknown(tmp_path: Path) -> None:
    # Precondition: vllm-serve's files name no GPUs, so no per-GPU figure exists.
    r = _pdbench("report", str(FIXTURES / "vllm-serve"), "--format", "json")
    rows = json.loads(r.stdout)["rows"]
    assert all(x["tput_per_gpu"] is None for x in rows)
    assert [x["total_tput"] for x in rows] == [9000.0, 24000.0] and [x["requests"] for x in rows] == [80, 320]
    r = _pdbench("report", str(FIXTURES / "vllm-serve"))
    assert "Total tok/s" in r.stdout and "| 9,000.0 |" in r.stdout
    r = _pdbench("report", str(FIXTURES / "vllm-serve"), "--format", "text", COLUMNS="80")
    assert "Absolute throughput (tok/s)" in r.stdout and "24,000" in r.stdout
    # With every split known the tables keep to per-GPU figures.
    r = _pdbench("report", str(TINY_1P1D))
    assert "Total tok/s/GPU" in r.stdout and "| Total tok/s |" not in r.stdout


# --- --slo, --plot, --label ---------------------------------------------------------------------------


def test_slo_says_when_it_cannot_apply(tmp_path: Path) -> None:
    # A bound on a latency no point records: vllm-serve has no TTFT p99.9, the decide run has both kinds.
    write_decide_run(tmp_path / "run")
    r = _pdbench("report", str(tmp_path / "run"), "--slo", "ttft_p99.9=100")
    assert "--slo ttft_p99.9: no point of those ISL/OSLs records p99.9_ttft_ms, so none can meet it" in r.stdout


def test_plot_refuses_an_empty_chart(tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    r = _pdbench("report", str(FIXTURES / "vllm-serve"), "--plot", str(png))
    assert r.returncode == 1
    assert "--plot" in r.stderr and "the chart would be empty; nothing written" in r.stderr
    assert not png.exists() and list(tmp_path.iterdir()) == []
    (tmp_path / "empty").mkdir()
    r = _pdbench("report", str(tmp_path / "empty"), "--plot", str(png))
    assert r.returncode == 1 and "no usable result files; no plot written" in r.stderr and not png.exists()


def test_labels_name_the_runs() -> None:
    r = _pdbench(
        "report", str(DSR1_B), "--baseline", str(DSR1_A), "--label", "new", "--baseline-label", "old", "-f", "json"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["run"] for x in doc["runs"]] == ["old", "new"] and doc["baseline"] == "old"
    r = _pdbench("report", str(DSR1_B), "--label", "a", "--label", "b")
    assert r.returncode == 2 and "--label: 2 labels for 1 run(s)" in r.stderr
    r = _pdbench("report", str(DSR1_B), "--label", " ")
    assert r.returncode == 2 and "--label: a label is empty" in r.stderr


# --- HTML in a browser ----------------------------------------------------------------------------------


def test_html_results_table_fits_a_1400px_window(tmp_path: Path) -> None:
    # The widest mix of the fixtures: five runs, a baseline (changes under every value), points
    # without a GPU split (the absolute columns too).
    page = tmp_path / "report.html"
    runs = [str(FIXTURES / n) for n in ("srt-slurm-4049", "srt-slurm-agg-4100", "vllm-serve")] + [str(DSR1_B)]
    r = _pdbench("report", *runs, "--baseline", str(DSR1_A), "--out", str(page))
    assert r.returncode == 0, r.stderr
    probe = (
        "<script>document.body.dataset.fit = JSON.stringify({client: document.documentElement.clientWidth, "
        "scroll: document.documentElement.scrollWidth, heads: document.querySelectorAll('table.results th').length, "
        "right: Math.ceil(document.querySelector('table.results').getBoundingClientRect().right)})</script>"
    )
    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", probe + "</body>"))
    dom = subprocess.run(
        [
            headless_browser(),
            "--headless=new",
            "--no-sandbox",  # as root, in a container
            "--disable-gpu",
            "--window-size=1400,900",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            measured.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    m = re.search(r'data-fit="([^"]+)"', dom.stdout)
    assert m, f"the page was not measured: {dom.stderr[-2000:]}"
    fit = json.loads(m[1].replace("&quot;", '"'))
    assert fit["heads"] == 20  # precondition: the absolute columns are there (7 ids + 13 metrics)
    assert 1300 < fit["client"] <= 1400
    assert fit["right"] <= fit["client"] and fit["scroll"] <= fit["client"], fit


# --- collect ------------------------------------------------------------------------------------------


def test_collect_says_once_what_to_pass_for_the_hardware(tmp_path: Path) -> None:
    out = tmp_path / "agg.json"
    r = _pdbench("collect", str(TINY_1P1D), str(TINY_1P2D), "--include-unverified", "--out", str(out))
    assert r.returncode == 1 and not out.exists()
    assert r.stderr.count("pass --hw") == 1
    assert "4 point(s) have no hardware name: pass --hw NAME" in r.stderr
    r = _pdbench("collect", str(TINY_1P1D), "--include-unverified", "--out", str(out), RUNNER_TYPE="h100-disagg")
    assert r.returncode == 0, r.stderr
    assert [e["hw"] for e in json.loads(out.read_text())] == ["h100-disagg"] * 2
