"""Submit's progress through the health wait, phase by phase: a job with an aggregated
baseline waits twice (its disaggregated servers, then the baseline's), and each wait is
followed on its own, read from the nodes' logs as harness.node.runtime writes them."""

from __future__ import annotations

import io
import json
from pathlib import Path

from harness.launch.health_wait import READY, HealthWait
from harness.rundir import RunDir

PROCS = [
    ("prefill-0", "server", "disagg"),
    ("decode-0", "server", "disagg"),
    ("proxy", "proxy", "disagg"),
    ("agg-0", "server", "aggregated"),
    ("proxy-agg", "proxy", "aggregated"),
]


def _run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path)
    run.plan.write_text(json.dumps({"processes": [{"name": n, "kind": k, "phase": p} for n, k, p in PROCS]}))
    run.logs.mkdir()
    return run


def _log(run: RunDir, name: str, *lines: str) -> None:
    with open(run.log(name), "a") as f:
        f.writelines(f"2026-11-26 02:00:00,000 {name} INFO {line}\n" for line in lines)


def _said(wait: HealthWait, out: io.StringIO) -> str:
    out.seek(0)
    out.truncate()
    wait.pump()
    return out.getvalue()


def test_each_phase_has_its_own_wait(tmp_path: Path) -> None:
    run, out = _run(tmp_path), io.StringIO()
    wait = HealthWait(run, out, first_s=0, every_s=0)  # every pump reports
    _log(run, "prefill-0", "Loading weights")
    _log(run, "node0", "prefill-0 is healthy")
    said = _said(wait, out)
    assert said.startswith("health wait (disagg) 0:00: 1 of 3 ready; waiting for decode-0, proxy"), said
    _log(run, "node0", "decode-0 is healthy", "proxy is healthy", READY)
    assert _said(wait, out) == "" and not wait.ready
    # The disaggregated sweep runs: the baseline's servers have not started, so nothing is said.
    assert _said(wait, out) == ""
    _log(run, "node0", "node 0: phase aggregated")
    _log(run, "agg-0", "Compiling the model")
    said = _said(wait, out)
    assert said == "health wait (aggregated) 0:00: 0 of 2 ready; waiting for agg-0, proxy-agg\n  agg-0: " + (
        "2026-11-26 02:00:00,000 agg-0 INFO Compiling the model\n"
    ), said
    _log(run, "node0", "agg-0 is healthy", "proxy-agg is healthy", READY)
    assert _said(wait, out) == "" and wait.ready


def test_a_one_phase_job_is_not_labelled(tmp_path: Path) -> None:
    run, out = RunDir(tmp_path), io.StringIO()
    run.plan.write_text(json.dumps({"processes": [{"name": "agg-0", "kind": "server", "phase": "aggregated"}]}))
    run.logs.mkdir()
    wait = HealthWait(run, out, first_s=0, every_s=0)  # every pump reports
    assert _said(wait, out) == "health wait 0:00: 0 of 1 ready; waiting for agg-0\n"
    _log(run, "node0", "agg-0 is healthy", READY)
    assert _said(wait, out) == "" and wait.ready
