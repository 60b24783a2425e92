"""The nsys preflight of a node whose servers run under nsys: which nodes check it, and what the
check makes of an nsys that converts its captures, one that leaves raw .qdstrm streams (as the
nsys inside Nsight Compute did on an H200), none on PATH, and one that hangs. The fake nsys
scripts write what the real ones wrote for `nsys profile -t none -o DIR/probe true`."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from harness.config import load_recipe
from harness.node.node_checks import checks_for
from harness.node.preflight import check_nsys
from harness.render.job import current_context, render_job
from harness.topology import PlanFile

# The report the real tool leaves: <-o>.nsys-rep when it converts, <-o>.qdstrm when it cannot.
FAKE = """#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
{body}
"""


def _nsys(tmp_path: Path, body: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nsys"
    exe.write_text(FAKE.format(body=body))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_an_nsys_that_writes_a_report_passes(tmp_path: Path) -> None:
    env = _nsys(tmp_path, ': > "$out.nsys-rep"')
    assert check_nsys(env) == []


def test_an_nsys_that_leaves_a_raw_stream_is_named_with_the_way_out(tmp_path: Path) -> None:
    env = _nsys(tmp_path, 'echo "skipping importation of the QDSTRM file"; : > "$out.qdstrm"')
    (problem,) = check_nsys(env)
    assert "cannot convert its captures" in problem and ".qdstrm" in problem
    assert str(tmp_path / "bin" / "nsys") in problem and "tool: torch" in problem


def test_no_nsys_on_path_is_named(tmp_path: Path) -> None:
    (problem,) = check_nsys({"PATH": str(tmp_path)})
    assert problem.startswith("nsys is not on PATH")


def test_a_failing_or_silent_nsys_is_named(tmp_path: Path) -> None:
    env = _nsys(tmp_path, "echo 'no driver' >&2; exit 3")
    (problem,) = check_nsys(env)
    assert "could not capture" in problem and "exit 3" in problem and "no driver" in problem
    (tmp_path / "bin" / "nsys").write_text(FAKE.format(body=": nothing written"))
    (problem,) = check_nsys(env)
    assert "wrote no report" in problem and "found: nothing" in problem


def test_a_hanging_nsys_is_bounded(tmp_path: Path) -> None:
    env = _nsys(tmp_path, "sleep 60")
    t0 = time.monotonic()
    (problem,) = check_nsys(env, timeout_s=0.5)
    assert time.monotonic() - t0 < 5 and "did not answer within 0.5 s" in problem


def test_the_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    # nsys's temporary files go to the probe's own TMPDIR, removed with it.
    seen = tmp_path / "tmpdir_seen"
    env = _nsys(tmp_path, f'echo "$TMPDIR" > {seen}; : > "$TMPDIR/nsys-report-1.qdstrm"; : > "$out.nsys-rep"')
    assert check_nsys(env) == []
    probe_dir = Path(seen.read_text().strip())
    assert probe_dir.name.startswith("pdbench-nsys-probe-") and not probe_dir.exists()


@pytest.mark.parametrize(
    ("tool", "roles", "want"),
    [("nsys", ["decode"], "decode"), ("nsys", ["prefill"], "prefill"), ("torch", ["decode"], None)],
)
def test_only_nodes_of_servers_under_nsys_check_it(
    tool: str, roles: list[str], want: str | None, tmp_path: Path
) -> None:
    rr = load_recipe(
        "dsr1-fp8-h200-nixl-1p2d",
        [f"benchmark.profile={{points: [8], roles: {roles}, tool: {tool}}}"],
        cluster="example-h200-nixl",
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    render_job(rr, run_dir, current_context(run_dir, rr.root, rr))
    plan = PlanFile.model_validate_json((run_dir / "plan.json").read_text())
    nodes = sorted({n for w in plan.workers if w.role == want for n in w.nodes})
    assert (want is None) == (nodes == [])  # the recipe has servers of the profiled role
    assert plan.preflight.nsys_nodes == nodes
    for node in range(plan.num_nodes):
        assert ("nsys" in checks_for(plan, node, run_dir)) == (node in nodes)
