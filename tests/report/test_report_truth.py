"""The report's truth table (disaggregate or not?): the recorded 1P1D run of the tiny model on 2
GPUs against aggregated baselines written by the bench's own writer, per ISL/OSL and concurrency:
goodput per GPU under the SLO, the crossover, the reason from the bottleneck verdicts, what is
missing, and intervals over repeats."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bottleneck_runs import bottleneck_sections as disagg_verdicts

from harness.bench.results import BenchResult, write_result
from harness.interval import t_interval
from harness.report import output_html, output_md, output_text
from harness.report.build import build_report
from harness.report.model import Report, SectionTable
from harness.report.slo import parse_slo
from harness.rundir.bottleneck_summary import Baseline, RoleTiming
from harness.rundir.result_name import ResultName
from harness.validity.bottleneck import judge

pytestmark = pytest.mark.timeout(60)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
RECORDED = {c: FIXTURE / ResultName(c, math.inf, prefill_gpus=1, decode_gpus=1).filename for c in (1, 4)}
# The recorded 1P1D points (ISL 256 / OSL 32, tiny model "tiny", 1 prefill + 1 decode GPU).
TPUT = {c: json.loads(RECORDED[c].read_text())["total_token_throughput"] for c in RECORDED}
P99_TTFT = {c: json.loads(RECORDED[c].read_text())["p99_ttft_ms"] for c in RECORDED}
SHAPE = "ISL 256 / OSL 32"


def _agg_verdicts() -> dict[int, dict]:
    """An aggregated instance's verdicts: not saturated at C=1, decode-bound at C=4 (its TPOT tripled)."""
    low = {"aggregated": RoleTiming(requests=8, queue_ms=0.5, compute_ms=40.0, tpot_ms=5.0)}
    high = {"aggregated": RoleTiming(requests=16, queue_ms=1.0, compute_ms=45.0, tpot_ms=15.0)}
    base = Baseline(concurrency=1, roles=low)
    return {
        1: judge(None, low, None, 5.0, None, None, e2el_ms=300.0).model_dump(mode="json"),
        4: judge(None, high, None, 15.0, None, base, e2el_ms=600.0).model_dump(mode="json"),
    }


def _write(
    run: Path, conc: int, *, gpus: int | None = None, tput: float | None = None, md: dict | None = None, **keys: object
) -> None:
    """A recorded point written again by the bench's writer: as it was (gpus None) or as an
    aggregated point of `gpus` one-GPU replicas (the metadata of harness.render.job's baseline),
    with its total throughput, metadata (`md`) and other keys replaced."""
    data = BenchResult.model_validate_json(RECORDED[conc].read_text()).model_dump(mode="json")
    meta = data["metadata"]
    name = RECORDED[conc].name
    if gpus is not None:
        meta = {k: v for k, v in meta.items() if not k.startswith(("prefill_", "decode_"))}
        meta |= {
            "disagg": False,
            "baseline_of": "disagg",
            "connector": None,
            "num_workers": gpus,
            "tp": 1,
            "gpus": gpus,
        }
        name = ResultName(conc, math.inf, gpus=gpus).filename
    meta |= md or {}
    data |= {"metadata": meta, "total_token_throughput": TPUT[conc] if tput is None else tput, **keys}
    write_result(BenchResult.model_validate(data), run / name)


def _run(tmp_path: Path, name: str, agg: dict[int, float], *, disagg: dict[int, float] | None = None) -> Path:
    """The 1P1D run (disagg: its throughputs, default the recorded ones) with its aggregated baseline
    on the same 2 GPUs in the same directory, as one job writes both phases; agg: conc -> tok/s."""
    run = tmp_path / name / FIXTURE.name
    run.mkdir(parents=True)
    for control in ("plan.json", "status.json"):
        shutil.copy(FIXTURE / control, run / control)
    low, high = disagg_verdicts()
    for conc, verdict in ((1, low), (4, high)):
        if disagg is None or conc in disagg:
            _write(run, conc, tput=(disagg or TPUT)[conc], bottleneck=verdict)
    for conc, tput in agg.items():
        _write(run, conc, gpus=2, tput=tput, p99_ttft_ms=100.0, bottleneck=_agg_verdicts()[conc])
    return run


def _truth(report: Report) -> SectionTable:
    (table,) = [t for t in report.sections if t.title.startswith("Disaggregate or not")]
    return table


def _rows(table: SectionTable) -> dict[str, dict[str, str]]:
    return {r[2]: dict(zip(table.headers, r, strict=True)) for r in table.rows}


def test_the_crossover_where_disagg_starts_to_win(tmp_path: Path) -> None:
    # The baseline beats the recorded 1P1D at C=1 and falls behind at C=4; every point meets the SLO.
    assert P99_TTFT[4] < 1000  # precondition: the recorded 1P1D points meet the bound too
    run = _run(tmp_path, "job", {1: TPUT[1] * 1.25, 4: TPUT[4] * 0.8})
    report = build_report([run], slo=parse_slo("ttft_p99=1000"))
    table = _truth(report)
    assert table.title == (
        "Disaggregate or not: tiny on 2 GPUs, 1P1D nixl against 2 replicas (goodput per GPU under ttft_p99 <= 1000 ms)"
    )
    assert report.sections[0] is table  # the answer first
    rows = _rows(table)
    assert rows["1"]["Disagg goodput/GPU"] == f"{TPUT[1] / 2:,.1f}"
    assert rows["1"]["Agg goodput/GPU"] == f"{TPUT[1] * 1.25 / 2:,.1f}"
    assert (rows["1"]["Disagg/agg"], rows["1"]["Winner"]) == ("0.80x", "agg")
    assert (rows["4"]["Disagg/agg"], rows["4"]["Winner"]) == ("1.25x", "disagg (crossover)")
    # The reason: each side's bottleneck verdict at that point.
    assert rows["1"]["Why"] == "disagg not saturated; agg not saturated"
    assert rows["4"]["Why"] == "disagg prefill-bound; agg decode-bound"
    assert table.findings == (f"{SHAPE}: disagg starts to win at c4 (c1 agg, c4 disagg)",)
    # Every output carries it; the terminal's folds at 80 columns.
    text = output_text.render(report, width=80)
    assert "Disaggregate or not: tiny on 2 GPUs, 1P1D nixl" in text and "disagg starts to win at c4" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    md = output_md.render(report)
    assert "## Disaggregate or not: tiny on 2 GPUs" in md and "| disagg (crossover) |" in md
    assert "<h2>Disaggregate or not: tiny on 2 GPUs" in output_html.render(report)


def test_no_crossover_when_the_slo_takes_disaggs_goodput(tmp_path: Path) -> None:
    # The baseline is ahead at C=1; at C=4 1P1D has the throughput but its TTFT p99 misses the bound.
    bound = 500.0
    assert P99_TTFT[1] < bound < P99_TTFT[4]  # precondition: the recorded C=4 point misses it
    run = _run(tmp_path, "job", {1: TPUT[1] * 1.1, 4: TPUT[4] * 0.5})
    report = build_report([run], slo=parse_slo(f"ttft_p99={bound:g}"))
    rows = _rows(_truth(report))
    assert rows["1"]["Winner"] == "agg"
    assert rows["4"]["Disagg goodput/GPU"] == "0.0 (misses)" and rows["4"]["Disagg/agg"] == "0.00x"
    assert (
        rows["4"]["Winner"] == "agg" and rows["4"]["Why"] == "disagg prefill-bound, misses ttft_p99; agg decode-bound"
    )
    assert _truth(report).findings == (f"{SHAPE}: no crossover, disagg wins nowhere (c1 agg, c4 agg)",)
    # Without the SLO the same points are throughput only, and 1P1D wins at C=4.
    rows = _rows(_truth(build_report([run])))
    assert rows["4"]["Winner"] == "disagg (crossover)" and "no SLO" in _truth(build_report([run])).title


def test_a_missing_baseline_is_said_not_guessed(tmp_path: Path) -> None:
    # The 2-GPU baseline ran C=1 only; a one-GPU instance ran both (another GPU count: not compared).
    run = _run(tmp_path, "job", {1: TPUT[1] * 0.9})
    single = tmp_path / "single"
    for conc in (1, 4):
        _write(single, conc, gpus=1, tput=TPUT[conc] / 2 * 3)  # per GPU above 1P1D's: still not compared
    report = build_report([run, single], slo=parse_slo("ttft_p99=1000"))
    table = _truth(report)
    rows = _rows(table)
    assert rows["1"]["Winner"] == "disagg"
    assert (rows["4"]["Agg goodput/GPU"], rows["4"]["Disagg/agg"], rows["4"]["Winner"]) == ("–", "–", "missing")
    assert rows["4"]["Why"] == "disagg prefill-bound; no agg point on 2 GPUs"
    single_label = next(r.label for r in report.runs if r.path == single)
    assert table.findings == (
        f"{SHAPE}: disagg wins at every point compared, no crossover (c1 disagg)",
        f"missing at {SHAPE}, c4: no aggregated point on 2 GPUs; not compared",
        f"not compared: the aggregated points on 1 GPU ({single_label}): no disaggregated point of the model "
        "on 1 GPU, and per GPU across GPU counts is not like with like",
    )
    # No baseline on 2 GPUs at all: every row says so.
    (alone,) = [t for t in build_report([_run(tmp_path, "alone", {}), single]).sections if t.title.startswith("Dis")]
    assert alone.title.startswith("Disaggregate or not: tiny on 2 GPUs, 1P1D nixl against no aggregated baseline")
    assert [r[6] for r in alone.rows] == ["missing", "missing"]
    assert alone.findings[0] == f"missing at {SHAPE}, c1, c4: no aggregated point on 2 GPUs; not compared"
    # No table at all where the runs hold one kind only: nothing to compare.
    assert not [t for t in build_report([single]).sections if t.title.startswith("Disaggregate or not")]


def test_repeats_give_intervals_and_overlapping_ones_tie(tmp_path: Path) -> None:
    # Three jobs of the same recipe: the same cells three times. At C=1 the two sides' intervals
    # overlap (a tie), one baseline repeat missing the SLO there; at C=4 1P1D's lies above the baseline's.
    d1 = [TPUT[1] * f for f in (1.0, 1.04, 0.96)]
    a1 = [TPUT[1] * f for f in (1.02, 0.98, 1.01)]
    d4 = [TPUT[4] * f for f in (1.0, 1.01, 0.99)]
    a4 = [TPUT[4] * f for f in (0.6, 0.62, 0.61)]
    runs = [_run(tmp_path, f"job{i}", {1: a1[i], 4: a4[i]}, disagg={1: d1[i], 4: d4[i]}) for i in range(3)]
    miss = next(runs[2].glob("concurrency_1_*_gpus_2.json"))
    miss.write_text(json.dumps(json.loads(miss.read_text()) | {"p99_ttft_ms": 5000.0}))
    report = build_report(runs, slo=parse_slo("ttft_p99=1000"))
    rows = _rows(_truth(report))
    d1i = t_interval([t / 2 for t in d1])
    assert rows["1"]["Disagg goodput/GPU"] == f"{d1i.mean:,.1f} ± {d1i.half_width:,.1f} (n=3)"
    # The repeat that misses counts 0 goodput: the baseline's interval is wide, its mean lower.
    a1i = t_interval([a1[0] / 2, a1[1] / 2, 0.0])
    assert rows["1"]["Agg goodput/GPU"] == f"{a1i.mean:,.1f} ± {a1i.half_width:,.1f} (n=3, 2 meet)"
    assert d1i.overlaps(a1i) and d1i.mean > a1i.mean  # precondition: a tie by the intervals only
    assert rows["1"]["Winner"] == "tie" and rows["1"]["Why"].endswith("agg not saturated, misses ttft_p99")
    d4i, a4i = t_interval([t / 2 for t in d4]), t_interval([t / 2 for t in a4])
    assert rows["4"]["Agg goodput/GPU"] == f"{a4i.mean:,.1f} ± {a4i.half_width:,.1f} (n=3)"
    assert not d4i.overlaps(a4i)  # precondition: the intervals separate
    assert rows["4"]["Winner"] == "disagg (crossover)"
    assert _truth(report).findings == (f"{SHAPE}: disagg starts to win at c4 (c1 tie, c4 disagg)",)


def test_other_deployments_are_not_repeats(tmp_path: Path) -> None:
    # A 1P1D job over another connector on the same GPUs, without a baseline phase: a table per
    # disaggregated deployment against the same baseline, never pooled as repeats.
    run = _run(tmp_path, "job", {1: TPUT[1] * 0.9, 4: TPUT[4] * 1.1})
    bundled = tmp_path / "bundled"
    for conc in (1, 4):
        _write(bundled, conc, tput=TPUT[conc] * 1.5, md={"connector": "pdbench"})
    report = build_report([run, bundled], slo=parse_slo("ttft_p99=1000"))
    tables = [t for t in report.sections if t.title.startswith("Disaggregate or not")]
    assert [t.title.split(" (")[0] for t in tables] == [
        "Disaggregate or not: tiny on 2 GPUs, 1P1D nixl against 2 replicas",
        "Disaggregate or not: tiny on 2 GPUs, 1P1D pdbench against 2 replicas",
    ]
    nixl, bundled_rows = (_rows(t) for t in tables)
    assert nixl["1"]["Disagg goodput/GPU"] == f"{TPUT[1] / 2:,.1f}"  # one sample: no ± (not pooled)
    assert bundled_rows["1"]["Disagg goodput/GPU"] == f"{TPUT[1] * 1.5 / 2:,.1f}"
    assert [r["Winner"] for r in (nixl["1"], nixl["4"], bundled_rows["1"], bundled_rows["4"])] == [
        "disagg",
        "agg",
        "disagg",
        "disagg",
    ]
    assert tables[0].findings == (f"{SHAPE}: disagg wins only below c4 (c1 disagg, c4 agg)",)


def test_pdbench_report_prints_it(tmp_path: Path) -> None:
    run = _run(tmp_path, "job", {1: TPUT[1] * 1.25, 4: TPUT[4] * 0.8})
    cmd = [sys.executable, "-m", "harness", "report", str(run), "--slo", "ttft_p99=1000"]
    r = subprocess.run([*cmd, "--format", "md"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    row = f"| 256 | 32 | 4 | {TPUT[4] / 2:,.1f} | {TPUT[4] * 0.8 / 2:,.1f} | 1.25x | disagg (crossover) |"
    assert row + " disagg prefill-bound; agg decode-bound |" in r.stdout
    assert f"- ⚠️ {SHAPE}: disagg starts to win at c4 (c1 agg, c4 disagg)" in r.stdout
