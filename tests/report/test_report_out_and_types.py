"""`pdbench report --out FILE` never writes over a file (as `collect`), and a result file with a
field of the wrong type is reported with a warning naming the file and the field, not shown as if
nothing were wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.cli_run import pdbench

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests" / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"
POINT = "concurrency_4_req_rate_inf_gpus_2_ctx_1_gen_1.json"
pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("ext", ["md", "html", "json"])
def test_report_out_refuses_an_existing_file(tmp_path: Path, ext: str) -> None:
    out = tmp_path / f"report.{ext}"
    r = pdbench("report", str(RUN), "--out", str(out))
    assert r.returncode == 0 and out.stat().st_size > 0, r.stderr  # the run does make a report
    out.write_text("someone's notes\n")
    r = pdbench("report", str(RUN), "--out", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: {out} exists; report never overwrites (choose another --out)", r.stderr
    assert out.read_text() == "someone's notes\n"
    # The wording is collect's.
    agg = tmp_path / "agg.json"
    agg.write_text("[]\n")
    r = pdbench("collect", str(RUN), "--out", str(agg), "--hw", "cpu")
    assert f"error: {agg} exists; collect never overwrites (choose another --out)" in r.stderr, r.stderr


def test_report_warns_of_a_field_of_the_wrong_type(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    data = json.loads((run / POINT).read_text())
    # Precondition: the fields are numbers in the real file, and a clean copy reports no warning.
    assert isinstance(data["median_ttft_ms"], float) and isinstance(data["completed"], int), data
    r = pdbench("report", str(run), "--format", "md")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    data |= {"median_ttft_ms": "fast", "completed": "20", "random_input_len": 12.5}
    data["metadata"]["decode_gpus"] = [1]
    (run / POINT).write_text(json.dumps(data))

    for fmt in ("md", "csv", "text"):
        r = pdbench("report", "run", "--format", fmt, cwd=tmp_path)  # files are named relative to here
        assert r.returncode == 0, r.stderr
        warned = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: ")]
        where = f"warning: run/{POINT}: field"
        assert sorted(warned) == sorted(
            [
                f"{where} completed is '20' (str), not an integer; not used",
                f"{where} random_input_len is 12.5 (float), not an integer; not used",
                f"{where} median_ttft_ms is 'fast' (str), not a finite number; not used",
                f"{where} metadata.decode_gpus is [1] (list), not an integer; not used",
            ]
        ), (fmt, r.stderr)
    # The report body says it too, beside the point it concerns.
    r = pdbench("report", str(run), "--format", "md")
    assert "median_ttft_ms is 'fast' (str), not a finite number; not used" in r.stdout, r.stdout
