"""On the local three-node Slurm cluster with real vLLM, `pdbench search` of
searches/local-tiny-pd.yaml narrowed to the prefill factor (1P1D, 2P1D, 3P1D excluded, and the
aggregated baseline; see _narrowed) against the full grid run by hand:

- a `scancel` of a running candidate's job stops the search (exit 1, resume command printed);
  running it again keeps every finished candidate and runs the cancelled one anew;
- its winner is the grid's: every disaggregated candidate it skipped submitted over the whole
  ladder (every one when it skipped none), then `pdbench report --slo` (the report's own choice,
  not the search's code) names the best disaggregated point among those and the ones it ran;
- it spends fewer device-hours than that grid did, measured on the grid's own run directories,
  and than the grid estimate its report prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import require_vllm
from helpers import tokenizer_cache
from helpers.e2e_jobs import SKIP_FLAG_CHECK
from helpers.slurm_cluster import daemon_problems, processes_in_node_namespaces, require_cluster

from harness.rundir import RunDir, read_status

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ROOT / "searches" / "local-tiny-pd.yaml"
PDBENCH = [sys.executable, "-m", "harness"]


def _state(search_dir: Path) -> dict[str, dict[str, Any]]:
    path = search_dir / "state.json"
    if not path.exists():
        return {}
    return {c["name"]: c for c in json.loads(path.read_text())["candidates"]}


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the search cancels its jobs in flight
        out, _ = proc.communicate(timeout=150)
        pytest.fail(f"pdbench search did not end within {timeout} s:\n{out[-4000:]}")
    return proc.returncode, out


def _narrowed(tmp_path: Path) -> Path:
    """The shipped search with one decode worker: 1P1D and 2P1D run or are skipped, 3P1D is
    excluded by max_devices. Its 1P2D is the same kind of candidate as 2P1D (a role added
    beside a 1P1D that bounds it, docs/search.md "Pruning"), 2P1D the one whose bound rests on
    the capacity model (both prefill servers pinned to core 0); each candidate left out is a
    job fewer, by hand in the grid check or in the search when it skips none (about 85 s each
    in CI). The file keeps the shipped one's name, in a directory of its own."""
    spec = yaml.safe_load(SEARCH.read_text())
    assert len(spec["factors"]["decode"]) > 1 and spec["factors"]["decode"][0]["topology.decode.workers"] == 1
    spec["factors"]["decode"] = spec["factors"]["decode"][:1]
    spec["factors"]["prefill"].append({"topology.prefill.workers": 3, "topology.prefill.nodes": 3})
    path = tmp_path / "searches" / SEARCH.name
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _search(search: Path, search_dir: Path, results: Path) -> subprocess.Popen:
    args = [*PDBENCH, "search", str(search), "--search-dir", str(search_dir), "--results-dir", str(results)]
    args += SKIP_FLAG_CHECK
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _runs(search_dir: Path, name: str) -> list[Path]:
    """The candidate's run directories (its results root also holds the jobs' tokenizer cache)."""
    return sorted(p for p in (search_dir / "runs" / name).glob("*/*") if RunDir.is_run_dir(p))


def _device_hours(run: Path, devices: int) -> float:
    """Devices x the job's time on its nodes: from the first node's start record to the end the
    nodes recorded, read here from the run directory, independently of the search's own costing."""
    started = min(p.stat().st_mtime for p in (run / "nodes").glob("*.json"))
    status = read_status(RunDir(run))
    assert status is not None and status.get("finished_at"), f"{run}: no end recorded"
    return devices * (status["finished_at"] - started) / 3600


def test_search_resumes_after_scancel_picks_the_grid_winner_and_costs_less(tmp_path: Path) -> None:
    require_vllm()
    require_cluster(3)
    assert daemon_problems() == [], "the nodes' daemons were broken before this test"
    search = _narrowed(tmp_path)
    spec = yaml.safe_load(search.read_text())
    (slo_name, bounds), *_ = spec["slos"].items()
    search_dir, results = tmp_path / "search", tmp_path / "results"

    # 1. Run the search until the aggregated baseline, its last job, is running; then scancel it.
    proc = _search(search, search_dir, results)
    deadline = time.monotonic() + 1200
    baseline: dict[str, Any] | None = None
    while baseline is None:
        if proc.poll() is not None:
            pytest.fail(f"the search ended before its baseline ran:\n{proc.communicate()[0][-4000:]}")
        if time.monotonic() > deadline:
            proc.terminate()
            pytest.fail(f"no baseline job within 1200 s:\n{proc.communicate(timeout=150)[0][-4000:]}")
        running = [c for c in _state(search_dir).values() if c["kind"] == "agg" and c["status"] == "running"]
        baseline = running[0] if running and running[0].get("job_id") else None
        time.sleep(1)
    state = _state(search_dir)
    disagg = {n: c for n, c in state.items() if c["kind"] == "disagg"}
    # The precondition of the resume check: a finished candidate, and every other one decided.
    assert disagg["1p1d"]["status"] == "done", disagg["1p1d"]
    assert {c["status"] for c in disagg.values()} <= {"done", "skipped", "excluded"}, state
    assert sorted(disagg) == ["1p1d", "2p1d", "3p1d"], state
    assert disagg["3p1d"]["status"] == "excluded" and "max_devices" in disagg["3p1d"]["reason"]
    finished_runs = {n: _runs(search_dir, n) for n, c in disagg.items() if c["status"] == "done"}
    kept_files = {p: p.stat().st_mtime_ns for runs in finished_runs.values() for p in runs[0].glob("*.json")}
    assert kept_files
    subprocess.run(["scancel", baseline["job_id"]], check=True, timeout=60)
    rc, out = _finish(proc, 600)
    assert rc == 1, out[-4000:]
    assert f"search {search} --search-dir" in out, out[-3000:]  # how to resume
    assert _state(search_dir)[baseline["name"]]["status"] == "cancelled"

    # 2. Resume: the finished candidates are kept as they are; the baseline runs again.
    rc, out = _finish(_search(search, search_dir, results), 1200)
    assert rc == 0, out[-4000:]
    for name, runs in finished_runs.items():
        assert _runs(search_dir, name) == runs, f"{name} ran again:\n{out[-3000:]}"
        assert f"{name}: launching" not in out
    assert all(p.stat().st_mtime_ns == t for p, t in kept_files.items())
    assert len(_runs(search_dir, baseline["name"])) == 2 and _state(search_dir)[baseline["name"]]["status"] == "done"
    report = json.loads((search_dir / "report.json").read_text())
    assert (search_dir / "report.md").is_file() and (search_dir / "pareto.png").stat().st_size > 0
    assert all(c["reason"] for c in report["candidates"]), "every candidate says why it ran or not"
    choice = report["winners"][slo_name]
    assert choice["winner"] is not None, report
    contenders = {choice["winner"]["candidate"], *(t["candidate"] for t in choice["ties"])}
    spent = report["spend"]["device_hours"]
    assert spent < report["spend"]["grid_device_hours"], report["spend"]

    # 3. The full grid by hand: each disaggregated candidate the search skipped, over the whole
    #    ladder, with the search's own settings and no SLO search; then the report's SLO choice.
    #    What the grid checks is that no skipped candidate beats the ones the search measured:
    #    those stand in for by-hand runs of themselves (their runs climbed the same ladder up to
    #    its first miss, past the best point under the SLO), as its baseline run does for the
    #    report's aggregated side (whose disaggregated choice reads no aggregated point), and
    #    count in the grid's cost at their own measured device-hours. A job of about 70 s saved
    #    per measured candidate. When the search skipped none (a loaded machine's wide
    #    intervals), every candidate runs by hand: the check then compares independent runs.
    stand_in = any(c["status"] == "skipped" for c in disagg.values())
    grid = tmp_path / "grid"
    labels, runs, grid_hours = [], [], 0.0
    for c in report["candidates"]:
        if c["status"] == "excluded" or c["kind"] == "agg":
            continue
        if c["status"] == "done" and stand_in:
            (run,) = _runs(search_dir, c["name"])
            labels.append(c["name"])
            runs.append(run)
            grid_hours += _device_hours(run, c["devices"])
            continue
        sets = [s for s in c["overrides"] if not s.startswith("benchmark.slo_search")]
        args = [*PDBENCH, "submit", spec["recipe"], "--cluster", spec["cluster"], "--results-dir", str(grid)]
        args += SKIP_FLAG_CHECK
        tokenizer_cache.seed(grid)
        args += [x for s in sets for x in ("--set", s)] + ["--wait"]
        before = {p for p in grid.glob("*/*") if RunDir.is_run_dir(p)}
        r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, f"grid job {c['name']}:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
        (run,) = {p for p in grid.glob("*/*") if RunDir.is_run_dir(p)} - before
        labels.append(c["name"])
        runs.append(run)
        grid_hours += _device_hours(run, c["devices"])
    assert sorted(labels) == sorted(n for n, c in disagg.items() if c["status"] != "excluded"), labels
    labels.append(baseline["name"])
    runs.append(_runs(search_dir, baseline["name"])[-1])
    slo_arg = ",".join(f"{k}={v}" for k, v in bounds.items())
    out_json = tmp_path / "grid-report.json"
    cmd = [*PDBENCH, "report", *map(str, runs), "--slo", slo_arg, "--out", str(out_json)]
    cmd += [x for label in labels for x in ("--label", label)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (decision,) = json.loads(out_json.read_text())["decisions"]
    best = decision["best"]["disagg"]
    assert best is not None, decision
    assert best["run"] in labels[:-1], decision  # a disaggregated run, not the baseline
    assert best["run"] in contenders, f"the grid picks {best['run']}, the search {contenders}"
    assert spent < grid_hours, f"the search spent {spent:.4f} device-hours, the grid by hand {grid_hours:.4f}"
    assert not any(processes_in_node_namespaces().values())
