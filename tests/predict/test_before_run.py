"""A run predicted before it runs (`pdbench submit`): the source run it is predicted from, the
prediction kept in the run directory, each result's check against it, and the report's table.
Measured against the mock engine, whose timing is known: a serial server, so the held-out
concurrencies' TTFT is the queue the profile's service time makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.mock_sweep import ISL, OSL, SERVICE_MS, mock_sweep
from typer.testing import CliRunner

from harness.cli import app
from harness.config import load_recipe
from harness.predict.answer import PredictError
from harness.predict.before_run import find_source, predict_before
from harness.rundir import RunDir
from harness.rundir.paths import PLAN, PRIOR_PREDICTION
from harness.rundir.prior_prediction import PredictedPoint, read

pytestmark = pytest.mark.timeout(180)

# The recipe of the mock's deployment: one aggregated server taking one request at a time.
AGG = [
    "topology.aggregated_only=true",
    "topology.aggregated.workers=1",
    "topology.aggregated.nodes=1",
    "topology.aggregated.flags.max-num-seqs=1",
    f"benchmark.shapes=[{ISL}x{OSL}]",
    "benchmark.concurrency=[1,3,6]",
]


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mock measured at 1-8, with the lock of its recipe, as a job leaves it (the engine's limits)."""
    tmp = tmp_path_factory.mktemp("before")
    run = mock_sweep(tmp, tmp / "source", [1, 2, 4, 8])
    RunDir(run).lock.write_text(json.dumps(load_recipe("tiny-fp32-cpu-nixl-1p2d-vs-agg", AGG).locked()))
    return run


def test_each_point_is_predicted_from_the_source_and_checked_when_measured(source: Path, tmp_path: Path) -> None:
    rr = load_recipe("tiny-fp32-cpu-nixl-1p2d-vs-agg", AGG)
    prior = predict_before(rr, [source])
    assert [(p.concurrency, p.isl, p.osl, p.phase) for p in prior.points] == [(c, ISL, OSL, "agg") for c in (1, 3, 6)]
    assert prior.source == str(source) and prior.by == "pdbench submit"
    # A serial server: the c-th of c clients that start at once waits for the c - 1 before it.
    at6 = prior.points[-1]
    assert 5 * SERVICE_MS <= at6.ttft_p90_ms <= 6.5 * SERVICE_MS
    # The run then measures 3 and 6, which the source never did; each result keeps its check.
    run = tmp_path / "run"
    run.mkdir()
    (run / PRIOR_PREDICTION).write_text(prior.model_dump_json())
    mock_sweep(tmp_path, run, [3, 6])
    for c in (3, 6):
        (path,) = run.glob(f"concurrency_{c}_*.json")
        result = json.loads(path.read_text())
        check = result["metadata"]["prediction"]
        measured = {
            "ttft_p90_ms": result["p90_ttft_ms"],
            "tpot_mean_ms": result["mean_tpot_ms"],
            "goodput_per_device": result["total_token_throughput"],  # one GPU
        }
        assert check["measured"] == pytest.approx(measured)
        for key, err in check["error"].items():
            assert err == pytest.approx(check["predicted"][key] / measured[key] - 1)
            assert abs(err) <= 0.2, (c, key, check)
        assert check["source"] == str(source) and isinstance(check["inside"], bool)
    rc, out = _cli("report", str(run), "--format", "md")
    assert rc == 0, out
    rows = [r for r in out.split("Predicted before it ran")[1].splitlines() if r.startswith("| ")]
    assert len(rows) == 1 + 2  # the header and the two points


def test_a_point_is_checked_only_against_its_own_phase_and_shape() -> None:
    pp = PredictedPoint(
        concurrency=4, isl=16, osl=8, ttft_p90_ms=10, tpot_mean_ms=2, goodput_per_device=100, band=0.1, phase="disagg"
    )
    assert pp.matches(4, 16, 8, "disagg")
    assert not pp.matches(4, 16, 8, "agg") and not pp.matches(4, 32, 8, "disagg") and not pp.matches(8, 16, 8, "disagg")
    assert pp.model_copy(update={"phase": None}).matches(4, 16, 8, "agg")  # a search's points: any phase
    check = pp.check(12.5, 2.0, 80.0)
    assert check.error == pytest.approx({"ttft_p90_ms": -0.2, "tpot_mean_ms": 0.0, "goodput_per_device": 0.25})
    assert check.inside is False and pp.check(None, None, 95.0).inside is True
    assert pp.check(None, None, None).error["goodput_per_device"] is None


def _run(
    results: Path,
    run_id: str,
    rr_overrides: list[str],
    phase_files: list[str],
    cluster: str | None = None,
    **connector: str,
) -> Path:
    """A run directory as a finished job leaves it, for the source search: its lock and result names."""
    rr = load_recipe("tiny-fp32-cpu-nixl-1p2d", rr_overrides, cluster=cluster)
    run = results / rr.name / run_id
    run.mkdir(parents=True)
    (run / PLAN).write_text("{}")
    lock = rr.locked() | {"cluster_profile": str(rr.cluster_file) if rr.cluster_file else None}
    lock["recipe"]["connector"] |= connector
    RunDir(run).lock.write_text(json.dumps(lock))
    for f in phase_files:
        (run / f).write_text("{}")
    return run


def test_the_source_is_the_newest_comparable_run_of_the_same_topology_first(tmp_path: Path) -> None:
    disagg = ["concurrency_1_req_rate_inf_gpus_3_ctx_1_gen_2.json"]
    rr = load_recipe("tiny-fp32-cpu-nixl-1p2d", [], cluster="local")
    assert find_source(tmp_path, rr) is None
    other_topology = _run(tmp_path, "20261201T010000Z-aaaaaa", ["topology.decode.workers=1"], disagg, "local")
    assert find_source(tmp_path, rr) == other_topology  # nothing of the same topology: the newest comparable
    same = _run(tmp_path, "20261201T020000Z-bbbbbb", [], disagg, "local")
    _run(tmp_path, "20261201T030000Z-cccccc", ["topology.decode.workers=1"], disagg, "local")
    assert find_source(tmp_path, rr) == same  # the same topology wins over a newer other one
    # Newer runs that are not comparable are passed over, each for its own reason.
    _run(tmp_path, "20261201T040000Z-dddddd", [], disagg, None)  # another cluster profile
    _run(tmp_path, "20261201T050000Z-eeeeee", [], disagg, "local", name="mooncake")
    _run(tmp_path, "20261201T060000Z-ffffff", ["model=pdbench-copy"], disagg, "local")
    _run(tmp_path, "20261201T070000Z-gggggg", [], [], "local")  # no result files
    _run(tmp_path, "20261201T080000Z-hhhhhh", [], ["concurrency_1_req_rate_inf_gpus_2.json"], "local")  # agg only
    assert find_source(tmp_path, rr) == same
    assert find_source(tmp_path, rr, exclude=same) is not None


def test_submit_keeps_the_prediction_and_refuses_a_source_that_cannot_give_one(source: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    base = ["--launcher", "local", "--dry-run", "--skip-flag-check", "--results-dir", str(results)]
    sets = [a for s in AGG for a in ("--set", s)]
    rc, out = _cli("submit", "tiny-fp32-cpu-nixl-1p2d-vs-agg", *sets, *base, "--predict-from", str(source))
    assert rc == 0, out
    assert f"predicted before it runs from {source}: 3 points -> {PRIOR_PREDICTION}" in out
    (run,) = results.glob("*/*")
    assert [p.concurrency for p in read(run / PRIOR_PREDICTION).points] == [1, 3, 6]
    # The source measured aggregated serving only: it cannot predict the disaggregated recipe.
    rc, out = _cli("submit", "tiny-fp32-cpu-nixl-1p2d-vs-agg", *base, "--predict-from", str(source))
    assert rc != 0 and f"--predict-from: {source}: no disagg points" in out
    rc, out = _cli("submit", "tiny-fp32-cpu-nixl-1p2d-vs-agg", *base, "--predict-from", str(tmp_path / "nope"))
    assert rc != 0 and "--predict-from:" in out and "nope" in out
    assert len(list(results.glob("*/*"))) == 1  # nothing created for either
    # Without --predict-from and nothing comparable under --results-dir: said, and the run goes on.
    rc, out = _cli("submit", "tiny-fp32-cpu-nixl-1p2d-vs-agg", *sets, *base)
    assert rc == 0 and "no prediction before the run: no earlier run of model tiny-llama" in out
    with pytest.raises(PredictError, match="no disagg points"):
        predict_before(load_recipe("tiny-fp32-cpu-nixl-1p2d"), [source])
