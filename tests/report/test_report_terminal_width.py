"""`pdbench report` in an 80-column terminal: every table fits with no column dropped and no word
broken (a wide one is folded: constant columns said once, the rest split), and the latency tables
carry TTFT p90 and TPOT/ITL p50, p90, p99 where the results have them."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers.bottleneck_runs import bottleneck_run, bottleneck_sections
from helpers.cli_run import pdbench

from harness.report.bottleneck import BOTTLENECK_HEADERS

ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / "tests" / "fixtures" / "results" / "vllm-serve"
pytestmark = pytest.mark.timeout(120)


def _terminal(*args: str) -> str:
    """The report as an 80-column terminal gets it (rich takes the width from COLUMNS)."""
    r = pdbench("report", *args, "--format", "text", env=os.environ | {"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_bottleneck_table_fits_80_columns_whole(tmp_path: Path) -> None:
    low, high = bottleneck_sections()  # the verdicts harness.validity.bottleneck writes into a result
    run = bottleneck_run(tmp_path, {1: low, 4: high})
    text = _terminal(str(run))
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80, [ln for ln in lines if len(ln) > 80]
    section = text[text.index("Bottleneck per point") : text.index("Verdict: the saturated")]
    # Every column is there, and each verdict and share reads whole on one line.
    flat = " ".join(section.split())
    for header in BOTTLENECK_HEADERS:
        assert all(word in flat for word in header.split()), (header, section)
    for word in ("not saturated", "prefill-bound", "prefill 52%", "prefill 74%", "no rule fired"):
        assert any(word in ln for ln in section.splitlines()), (word, section)
    assert "prefill: queue + compute grew 3.5x over C=1" in flat, section
    # What every row shares is said once, above the table.
    assert "All rows: Serving disagg, ISL 256, OSL 32" in section, section


def test_the_latency_tables_carry_the_tail_percentiles(tmp_path: Path) -> None:
    low, high = bottleneck_sections()
    run = bottleneck_run(tmp_path, {1: low, 4: high})
    data = {p.name: json.loads(p.read_text()) for p in run.glob("concurrency_*.json")}
    (c4,) = [d for d in data.values() if d["max_concurrency"] == 4]
    # Precondition: the bench's result has the percentiles.
    assert all(f"p{q}_{m}_ms" in c4 for q in (90, 99) for m in ("ttft", "tpot", "itl")), sorted(c4)
    text = _terminal(str(run))
    assert max(len(ln) for ln in text.splitlines()) <= 80
    for head in ("TTFT p90", "TPOT p90", "TPOT p99", "ITL p90", "ITL p99"):
        assert head in text, text
    row = next(ln for ln in text[text.index("Latency per output token") :].splitlines() if re.match(r"A\s+4\s", ln))
    assert row.split()[2:] == [
        f"{c4[k]:.1f}"
        for k in ("median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms")
    ], row
    md = pdbench("report", str(run), "--format", "md").stdout
    assert "| TTFT p90 (ms) |" in md and "| TPOT p99 (ms) | ITL p50 (ms) | ITL p90 (ms) | ITL p99 (ms) |" in md, md

    # vllm bench serve's default percentiles are p99 only: no empty p90 columns.
    text = _terminal(str(VLLM))
    assert "TPOT p99" in text and "ITL p99" in text and "p90" not in text, text
