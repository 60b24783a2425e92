"""The search by prediction: ordered and pruned by what the first measured candidate's profile
predicts, measured where the decision depends on it, and every measured candidate checked against
the prediction made before it ran.

The jobs are a fake launcher's whose points come from a world of known timing: a disaggregated
server simulated (harness.predict.simulate) with set service times and noise, prefill 0.05 ms a
token + 2 ms, a decode step of 4 + 2 B ms at batch B, 1 ms of KV hand-off and 1 ms of proxy and
client. Under a TPOT bound of 13 ms decode limits every candidate: 1P2D serves the most per device,
2P1D (one decode worker on 3 devices) the least.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers.search_launcher import SEARCH, FakeJob, FakeLauncher, statuses
from helpers.search_world import LADDER, SLOS, begin, world_point

from harness import atomic
from harness.launch.job import Job, JobState
from harness.predict import band
from harness.rundir import RunDir
from harness.rundir.result_name import ResultName
from harness.search import foresee
from harness.search.driver import prepare
from harness.search.outcome import CandidateOutcome
from harness.search.prune import next_decision
from harness.search.search_dir import SearchDir
from harness.search.space import Candidate

pytestmark = pytest.mark.timeout(120)

WALL_S = 60.0  # every fake job's wall time


class WorldLauncher(FakeLauncher):
    """A fake launcher whose disaggregated points are the world's (the baseline's: the fake's)."""

    def launch(self, run: RunDir, num_nodes: int) -> Job:
        name = run.path.parent.parent.name
        assert self.sdir is not None
        c = self.sdir.states[name].candidate
        if c.kind == "agg":
            return super().launch(run, num_nodes)
        self.launched.append(name)
        over = dict(o.split("=", 1) for o in c.overrides)
        prefill, decode = int(over["topology.prefill.workers"]), int(over["topology.decode.workers"])
        isl = int(over.get("benchmark.isl", 256))
        start = 1_000_000.0 + 1000 * len(self.launched)
        atomic.write_json(
            run.launch_record, {"launcher": "slurm", "job_id": str(len(self.launched)), "host": "h", "time": start}
        )
        for i, conc in enumerate(LADDER):
            point = world_point(c, prefill, decode, conc, isl, 32, seed=i)
            point["benchmark_start_time_unix"] = start + 10 + 10 * i
            rn = ResultName(conc, math.inf, None, c.prefill_devices, c.decode_devices)
            (run.path / rn.filename).write_text(json.dumps(point))
        end = start + WALL_S
        atomic.write_json(run.status, {"state": "succeeded", "exit_code": 0, "reason": None, "finished_at": end})
        job = FakeJob(run, str(len(self.launched)), self.states.get(name, [JobState.RUNNING, JobState.COMPLETED]))
        self.jobs[name] = job
        return job


def test_the_prediction_prunes_what_the_throughput_bound_keeps_to_the_grids_winner(tmp_path: Path) -> None:
    grid = WorldLauncher()
    g = begin(tmp_path / "grid", grid, predict="off")
    assert g.run() == 0
    assert sorted(grid.launched) == ["1p1d", "1p2d", "2p1d"]  # the grid: every candidate measured
    grid_best = json.loads(g.sdir.report_json.read_text())["winners"]["decode"]["winner"]["candidate"]

    fake = WorldLauncher()
    s = begin(tmp_path / "search", fake)
    assert s.run() == 0
    state = SearchDir(s.sdir.path).read_state()
    # 1P1D first (fewest devices), then by predicted objective: 1P2D; 2P1D pruned unmeasured.
    assert fake.launched == ["1p1d", "1p2d"], {n: st.reason for n, st in state.items()}
    assert state["2p1d"].status == "skipped" and state["2p1d"].pruned_by == foresee.RULE
    assert state["2p1d"].reason.startswith("pruned by prediction"), state["2p1d"].reason
    assert not list(s.sdir.results_dir("2p1d").glob("*"))
    report = json.loads(s.sdir.report_json.read_text())
    assert report["winners"]["decode"]["winner"]["candidate"] == grid_best == "1p2d"
    # The precondition: the throughput bound alone keeps 2P1D (1P1D's interval is unknown, n=1).
    finished = [(st.candidate, CandidateOutcome.from_json(st.outcome)) for st in state.values() if st.outcome]
    assert next_decision(state["2p1d"].candidate, finished, SLOS, 1.1).run
    rows = {c["name"]: c for c in report["candidates"]}
    assert rows["2p1d"]["measured_or_pruned"] == "pruned: prediction"
    assert rows["1p2d"]["measured_or_pruned"] == "measured"
    assert rows["2p1d"]["forecast"]["slos"]["decode"]["high"] < rows["1p2d"]["outcome"]["slos"]["decode"]["samples"][0]
    md = s.sdir.report_md.read_text()
    assert "pruned: prediction" in md and "prediction error" in md


def test_the_prediction_made_before_a_candidate_ran_is_within_a_stated_error(tmp_path: Path) -> None:
    fake = WorldLauncher()
    s = begin(tmp_path, fake, predict="order")  # everything measured, in predicted order
    assert s.run() == 0
    assert fake.launched == ["1p1d", "1p2d", "2p1d"]
    report = json.loads(s.sdir.report_json.read_text())
    rows = {c["name"]: c for c in report["candidates"]}
    assert rows["1p1d"]["forecast"] is None  # the profile's own source: no prediction before it ran
    for name in ("1p2d", "2p1d"):
        f = rows[name]["forecast"]
        assert f["made_at"] < SearchDir(s.sdir.path).read_state()[name].started_at  # made before it ran
        err = rows[name]["prediction_error"]["decode"]
        # Two-sided: the world is the model's kind, so what is left is the fit's and the noise's.
        assert err is not None and -0.15 <= err <= 0.15, (name, err, f["slos"])
        assert f["slos"]["decode"]["best"] == rows[name]["outcome"]["slos"]["decode"]["best"]


def test_an_extrapolating_prediction_is_measured_not_pruned(tmp_path: Path) -> None:
    # A second factor: prompts of 1024 tokens, four times what 1P1D at 256 was profiled at.
    factors = {**SEARCH["factors"], "isl": [{"benchmark.isl": 256}, {"benchmark.isl": 1024}]}
    fake = WorldLauncher()
    s = begin(tmp_path, fake, factors=factors)
    assert s.run() == 0
    state = SearchDir(s.sdir.path).read_state()
    long = [n for n in state if n.endswith("1024") and state[n].status != "excluded"]
    assert long, list(state)
    for n in long:
        f = state[n].forecast
        assert f is not None and any("isl 1024" in x for p in f["points"] for x in p["extrapolating"]), f
        assert n in fake.launched and state[n].pruned_by is None, state[n].reason
        assert any("isl 1024" in x for x in f["extrapolating"])
    # The same search with prune-all prunes by those predictions too: the rule above is what kept them.
    fake2 = WorldLauncher()
    s2 = begin(tmp_path / "all", fake2, factors=factors, predict="prune-all")
    assert s2.run() == 0
    assert any(n not in fake2.launched for n in long)


def test_a_resume_keeps_the_predictions_made_before_the_interrupt(tmp_path: Path) -> None:
    fake = WorldLauncher(states={"1p2d": [JobState.RUNNING, JobState.CANCELLED]})
    s = begin(tmp_path, fake)
    assert s.run() == 1
    first = SearchDir(s.sdir.path).read_state()
    assert first["1p2d"].status == "cancelled" and first["1p2d"].forecast is not None
    made = first["1p2d"].forecast["made_at"]

    again = WorldLauncher()
    s2 = begin(tmp_path, again)
    assert s2.run() == 0
    assert again.launched == ["1p2d"]  # 1p1d kept; 2p1d pruned by prediction
    state = statuses(s2)
    assert state == {"1p1d": "done", "1p2d": "done", "2p1d": "skipped", "2p2d": "excluded"}
    after = SearchDir(s2.sdir.path).read_state()
    assert after["1p2d"].forecast is not None and after["1p2d"].forecast["made_at"] == made
    assert after["2p1d"].pruned_by == foresee.RULE


def test_a_band_reaching_the_best_measured_keeps_the_candidate() -> None:
    # Central prediction below the best measured, optimistic above it: the decision depends on it.
    point = foresee.PointForecast(4, 100.0, 10.0, 95.0, 0.1, {"p90_tpot_ms": 10.0}, ())
    f = foresee.Forecast("x", "runs/a", 0.0, (point,), {"decode": foresee.SLOForecast(4, 95.0, 85.5, 104.5)})
    m = Candidate("m", "disagg", (), 1, 1, 2, {"prefill": 1.0, "decode": 1.0})
    from harness.interval import t_interval
    from harness.search.outcome import Cost, Limit, SLOOutcome

    o = SLOOutcome(4, (100.0,), t_interval([100.0], 0.95), Limit("decode", 8, ("tpot",), ()), 4)
    out = CandidateOutcome("m", 2, "succeeded", None, True, {"decode": o}, (), Cost(None, None, None, None, 4))
    assert foresee.prunes(f, [(m, out)], SLOS, "prune") is None
    narrow = foresee.Forecast("x", "runs/a", 0.0, (point,), {"decode": foresee.SLOForecast(4, 95.0, 90.0, 99.0)})
    assert foresee.prunes(narrow, [(m, out)], SLOS, "prune") is not None
    assert foresee.prunes(narrow, [(m, out)], SLOS, "order") is None


def test_the_band_is_the_fits_spread_and_the_seeds_and_widens_where_it_extrapolates() -> None:
    from harness.predict.model import Deployment, Prediction
    from harness.rundir.perf_profile import LinearFit, PerfProfile

    fit = LinearFit(x="prompt_tokens", intercept_ms=0.0, slope_ms=0.1, n=4, x_min=100, x_max=300, rms_ms=2.0)
    step = LinearFit(x="decode_batch", intercept_ms=10.0, slope_ms=0.0, n=4, x_min=1, x_max=8, rms_ms=0.0)
    profile = PerfProfile(
        phase="disagg", prefill=fit, decode_step=step, prefill_workers=1, decode_workers=1,
        gpus_per_prefill_worker=1, gpus_per_decode_worker=1, max_num_seqs=64, max_batched_tokens=8192,
        osl_range=(32, 32), concurrency_range=(1, 8), points=[],
    )  # fmt: skip
    d = Deployment("disagg", 1, 1, 1, 1)

    def p(seeds: tuple[float, ...], extrapolating: list[str]) -> Prediction:
        return Prediction(d, 4, 200, 32, {}, {}, 100.0, 4.0, extrapolating, seeds)

    # prefill: 2 ms of residual over 20 ms at 200 tokens (10 %); the seeds agree: 2 sd = 20 %.
    assert band.band_of(profile, p((100.0, 100.0, 100.0), [])) == pytest.approx(0.2)
    # The seeds' own spread adds in quadrature.
    assert band.band_of(profile, p((90.0, 100.0, 110.0), [])) == pytest.approx(2 * math.hypot(0.1, 0.1))
    assert band.band_of(profile, p((100.0, 100.0, 100.0), ["isl"])) == pytest.approx(0.2 * band.WIDEN)
    quiet = profile.model_copy(update={"prefill": fit.model_copy(update={"rms_ms": 0.0})})
    assert band.band_of(quiet, p((100.0, 100.0, 100.0), [])) == band.FLOOR


def test_each_measured_point_carries_its_prediction_and_the_report_shows_the_error(tmp_path: Path) -> None:
    from harness.report.build import build_report
    from harness.report.prior import TITLE
    from harness.rundir.prior_prediction import read

    fake = WorldLauncher()
    s = begin(tmp_path, fake, predict="order")
    assert s.run() == 0
    state = SearchDir(s.sdir.path).read_state()
    assert state["1p1d"].run is not None and not RunDir(s.sdir.path / state["1p1d"].run).prior_prediction.exists()
    for name in ("1p2d", "2p1d"):
        run = s.sdir.path / str(state[name].run)
        prior = read(RunDir(run).prior_prediction)
        assert prior.made_at < float(state[name].started_at or 0) and prior.source == state["1p1d"].run
        assert [p.concurrency for p in prior.points] == LADDER
        report = build_report([run])
        table = next(t for t in report.sections if t.title == TITLE)
        assert [r[2] for r in table.rows] == [str(c) for c in LADDER]
        errors = [float(r[-3].rstrip("%")) / 100 for r in table.rows]
        # Two-sided, every point: the measured goodput per device within 15 % of the prediction.
        assert all(-0.15 <= e <= 0.15 for e in errors), (name, errors)


def test_a_profile_given_with_from_orders_and_prunes_from_the_start(tmp_path: Path) -> None:
    first = WorldLauncher()
    s1 = begin(tmp_path / "before", first, predict="off")
    assert s1.run() == 0
    measured = s1.sdir.path / str(SearchDir(s1.sdir.path).read_state()["1p1d"].run)

    spec = tmp_path / "s.yaml"
    spec.write_text((tmp_path / "before" / "s.yaml").read_text().replace("predict: 'off'", "predict: prune"))
    fake = WorldLauncher()
    s = prepare(
        str(spec),
        search_dir=tmp_path / "search",
        results_dir=tmp_path / "results",
        launcher_kind="slurm",
        cluster=None,
        skip_flag_check=True,
        from_run=measured,
    )
    s.make_launcher = lambda kind, rr: fake
    s.poll_s = 0.01
    fake.sdir = s.sdir
    assert f"--from {measured}" in s.resume
    assert s.run() == 0
    # The best predicted first; the rest cannot reach what it measured.
    assert fake.launched == ["1p2d"]
    state = SearchDir(s.sdir.path).read_state()
    assert {state[n].pruned_by for n in ("1p1d", "2p1d")} == {foresee.RULE}
    assert state["1p2d"].forecast is not None and state["1p2d"].forecast["source"] == str(measured.resolve())

    from harness.submit.refused import Refused

    with pytest.raises(Refused, match=rf"--from {tmp_path}.*no result files"):
        prepare(str(spec), search_dir=tmp_path / "x", results_dir=tmp_path, launcher_kind="slurm", cluster=None,
                from_run=tmp_path)  # fmt: skip
