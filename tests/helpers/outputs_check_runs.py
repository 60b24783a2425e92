"""Run directories whose points checked their outputs (sentinels) and ran accuracy evals, in the writers' formats."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.rundir import RunDir
from harness.rundir.sentinel_summary import SentinelSummary, Tolerance

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"

DSR1_A = FIXTURES / "dsr1-fp8-2p4d" / "20261201T100000Z-aaa111"

NAME = "concurrency_{}_req_rate_inf_gpus_48_ctx_16_gen_32.json"

T0 = 1_800_000_000.0

REFERENCE = "prefill-0: whole requests to http://127.0.0.1:8100 before the sweep"


def sentinel_section(
    conc: int,
    divergence: Sequence[int | None],
    not_compared: int = 0,
    unanswered: int = 0,
    unit: str = "token",
    **fields: Any,
) -> dict[str, Any]:
    """The bench client's section, through the model it writes with: `divergence` holds the
    compared sentinels' first divergence (None: equal), then come `not_compared` answered only
    by the measured path and `unanswered` not answered at all. `fields` overrides the rest."""
    compared = len(divergence)
    matched = sum(d is None for d in divergence)
    summary = {
        "reference": REFERENCE,
        "sent": compared + not_compared + unanswered,
        "answered": compared + not_compared,
        "compared": compared,
        "exact": matched,
        "matched": matched,
        "match_rate": round(matched / compared, 4) if compared else None,
        "first_divergence": (*divergence, *[None] * (not_compared + unanswered)),
        "unit": unit if compared else None,
        "tolerance": Tolerance(match_tokens=None, max_diverged=0),
        "record": f"sentinels/{NAME.format(conc)}",
    }
    return SentinelSummary(**summary | fields).model_dump(mode="json")


def outputs_rule(rate: float | None, status: str) -> dict[str, Any]:
    return {"name": "outputs_match", "status": status, "measured": rate, "threshold": 1.0, "detail": "d"}


def edit_result(run: Path, conc: int, **top: Any) -> dict[str, Any]:
    path = run / NAME.format(conc)
    d = json.loads(path.read_text())
    d |= top
    path.write_text(json.dumps(d))
    return d


def _fail_outputs(run: Path, conc: int) -> None:
    """A point whose outputs_match failed, as harness/validity writes it."""
    path = run / NAME.format(conc)
    d = json.loads(path.read_text())
    reason = "outputs_match: sentinel 2 diverged at token 17 (prompt 'abc'): ' x y' vs ' x z'"
    d["metadata"] |= {
        "valid": False,
        "validity_reasons": [reason],
        "validity": {
            "verdict": "invalid",
            "valid": False,
            "reasons": [reason],
            "rules": [outputs_rule(0.75, "failed")],
        },
    }
    path.write_text(json.dumps(d))


def outputs_check_run(tmp_path: Path, name: str = "run") -> Path:
    """DSR1_A (a pdbench run: 64, 128, 256; 256 invalid by kv_transferred) with sentinels. The
    sweep ran 256 first, then 64, then 128, and 128's outputs diverged."""
    run = tmp_path / name
    shutil.copytree(DSR1_A, run)
    edit_result(run, 256, benchmark_start_time_unix=T0, sentinels=sentinel_section(256, [None] * 4))
    edit_result(run, 64, benchmark_start_time_unix=T0 + 60, sentinels=sentinel_section(64, [None] * 4))
    edit_result(run, 128, benchmark_start_time_unix=T0 + 120, sentinels=sentinel_section(128, [None, 17, None, None]))
    _fail_outputs(run, 128)
    # The client's records of the sentinels, named like results, are not results.
    for conc in (64, 128, 256):
        record = RunDir(run).sentinel_record(NAME.format(conc)[:-5])
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"sentinels": []}))
    return run


def write_eval_summary(run: Path, phase: str, when: str, score: float | None, stderr: float | None, **kw: Any) -> None:
    task = {
        "task": "gsm8k",
        "metric": "exact_match,strict-match",
        "score": score,
        "stderr": stderr,
        "threshold": 0.7,
        "passed": None if score is None else score >= 0.7,
        "samples": 1319,
    }
    doc = {
        "phase": phase,
        "when": when,
        "concurrency": 256,
        "lm_eval_version": "0.4.9",
        "base_url": "http://127.0.0.1:8000",
        "elapsed_s": 812.5,
        "tasks": [task],
        "passed": task["passed"],
        "error": None,
    } | kw
    path = RunDir(run).accuracy_summary(phase, when)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
