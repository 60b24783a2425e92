"""The predictor against what is known exactly: a closed loop on a serial server (the simulator),
and a sweep of the mock engine whose timing its config sets (fitted times, held-out points)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.mock_sweep import ENGINE, ITL_MS, OSL, SERVICE_MS, TTFT_MS, mock_sweep

from harness.config import load_recipe
from harness.predict.answer import device_groups, targets
from harness.predict.fit import fit_profile
from harness.predict.holdout import leave_one_out, median_abs_error
from harness.predict.limits import kv_polled, limits
from harness.predict.model import Deployment, predict
from harness.predict.observe import Observation, observations
from harness.predict.simulate import SimConfig, seen_batch, simulate
from harness.rundir import perf_profile
from harness.rundir.paths import PERF_PROFILE
from harness.topology import plan

pytestmark = pytest.mark.timeout(180)

CONCURRENCY = [1, 2, 4, 8]


@pytest.mark.parametrize("c", [1, 3, 8])
def test_a_serial_server_queues_each_request_behind_the_others(c: int) -> None:
    # Closed loop of c clients on one server of one slot: each request waits for the c - 1 others.
    cfg = SimConfig("agg", c, 16, OSL, 1, 0, lambda t: TTFT_MS, lambda b: ITL_MS, max_num_seqs=1)
    r = simulate(cfg)
    assert r.percentile("ttft", 50) == pytest.approx((c - 1) * SERVICE_MS + TTFT_MS)
    assert r.percentile("tpot", 50) == pytest.approx(ITL_MS)
    assert r.output_throughput == pytest.approx(OSL / SERVICE_MS * 1000)


def test_decode_batches_share_a_step_and_prefill_batches_pay_per_token() -> None:
    # 1P1D, prefill 0.1 ms per token, decode step 2 + 0.5 B ms: at 4 clients decode runs 4 at once.
    cfg = SimConfig("disagg", 4, 100, 50, 1, 1, lambda t: 0.1 * t, lambda b: 2 + 0.5 * b)
    r = simulate(cfg)
    assert r.mean_decode_batch == pytest.approx(4, abs=0.3)
    assert r.percentile("tpot", 50) == pytest.approx(4.0, rel=0.1)
    assert not r.truncated


@pytest.mark.parametrize(
    ("groups", "ttfts"),
    [
        ((0, 0), [100.0]),  # one request: the idle worker on the same core costs nothing
        ((0, 1), [100.0, 100.0]),  # two cores: each prompt has its own
        ((0, 0), [200.0, 200.0]),  # one core: both prompts at once, each at half speed
        ((0, 0, 1), [100.0, 200.0, 200.0]),  # two share core 0, the third has core 1
    ],
)
def test_prefill_workers_sharing_a_core_share_its_time(groups: tuple[int, ...], ttfts: list[float]) -> None:
    # 100 ms a prompt, decode free, one request per client, round-robin: one on each worker.
    c = len(ttfts)
    cfg = SimConfig(
        "disagg", c, 16, 2, len(groups), 1, lambda t: 100.0, lambda b: 0.0, requests=c, prefill_groups=groups
    )
    assert sorted(simulate(cfg).ttft_ms) == pytest.approx(ttfts)


def test_two_prefill_workers_on_one_core_have_one_cores_capacity() -> None:
    # Prefill-bound (50 ms per 16-token prompt, batched or not; decode 1 ms a step): 2P1D on one
    # core serves what 1P1D does, 2P1D on two cores twice that.
    def tok_s(workers: int, groups: tuple[int, ...]) -> float:
        cfg = SimConfig(
            "disagg", 8, 16, 4, workers, 1, lambda t: 50.0 * t / 16, lambda b: 1.0, requests=400, prefill_groups=groups
        )
        return simulate(cfg).output_throughput

    one = tok_s(1, ())
    assert tok_s(2, (0, 0)) == pytest.approx(one, rel=0.05)
    assert tok_s(2, (0, 1)) == pytest.approx(2 * one, rel=0.1)


def test_the_batch_a_request_decodes_alongside_leaves_out_the_idle_time() -> None:
    # Two requests decoding together for 1 s, then decode idle for 1 s, then two more: every step
    # ran at 2, though the time average over the 3 s (Little's law) is 4/3.
    assert seen_batch([(0, 1), (0, 1), (2, 3), (2, 3)]) == pytest.approx(2.0)
    # One of 2 s beside one of 1 s: the short one saw 2 all along, the long one 2 for half its time.
    assert seen_batch([(0, 2), (0, 1)]) == pytest.approx((1.5 + 2.0) / 2)
    assert seen_batch([(1, 1)]) is None


def test_the_decode_line_fitted_from_a_simulated_world_is_its_step() -> None:
    # 1P1D whose decode steps take 2 + 0.5 B ms and whose prefill (20 ms a prompt) leaves decode
    # idle between bursts: the fit, given the simulated points, finds the step it was simulated
    # with. The time-average batch (Little's law) counts decode's idle time and finds a steeper
    # line (intercept 1.5, slope 0.82 here).
    obs = []
    for c in (1, 2, 4, 8):
        cfg = SimConfig("disagg", c, 256, 32, 1, 1, lambda t: 20.0 * t / 256, lambda b: 2.0 + 0.5 * b, requests=64)
        r = simulate(cfg)
        ttft = {"mean": sum(r.ttft_ms) / len(r.ttft_ms)} | {k: r.percentile("ttft", q) for k, q in _QS}
        obs.append(
            _obs(
                c,
                ttft_ms=ttft,
                ttft_min_ms=min(r.ttft_ms),
                tpot_ms=sum(r.tpot_ms) / len(r.tpot_ms),
                output_throughput=r.output_throughput,
                decode_batch_seen=r.mean_decode_batch,
            )
        )
    step = fit_profile(obs, Path("."), (256, 8192)).decode_step
    assert step.intercept_ms == pytest.approx(2.0, abs=0.3)
    assert step.slope_ms == pytest.approx(0.5, abs=0.05)


_QS = (("p50", 50), ("p90", 90), ("p99", 99))


def _obs(c: int, **measured: Any) -> Observation:
    """A 1P1D point of 256-token prompts and 32-token outputs, 64 requests."""
    base: dict[str, Any] = {
        "path": Path(f"c{c}.json"),
        "phase": "disagg",
        "concurrency": c,
        "isl": 256,
        "osl": 32,
        "e2el_ms": 0.0,
        "requests": 64,
        "prefill_workers": 1,
        "decode_workers": 1,
        "prefill_gpus": 1,
        "decode_gpus": 1,
        "overhead_ms": 0.0,
        "kv_ms": 0.0,
        "kv_source": "none",
    }
    return Observation(**(base | measured))


def test_the_proxys_legs_split_the_ttft_into_prefill_and_hand_off() -> None:
    # At C=1 the proxy saw prefill answer after 20 ms and the first token 15 ms later, of which
    # decode's first step is 3 ms; the KV bytes over their rate say 2 ms. The prompt's service is
    # the prefill leg and the hand-off the other 12 ms: the KV bytes' time alone would leave the
    # decode's taking in of the request to prefill (30 - 2 - 3 = 25 ms from the fastest request).
    legs = {"prefill_leg_ms": 20.0, "decode_leg_ms": 15.0, "kv_ms": 2.0, "kv_source": "kv_handoff"}
    common = {"ttft_ms": {"mean": 36.0, "p50": 35.0, "p90": 40.0, "p99": 44.0}, "ttft_min_ms": 30.0}
    obs = [
        _obs(1, tpot_ms=3.0, output_throughput=200.0, decode_batch_seen=1.0, **common, **legs),
        _obs(4, tpot_ms=4.0, output_throughput=600.0, decode_batch_seen=3.5, **common, **legs),
    ]
    p = fit_profile(obs, Path("."), (256, 8192))
    assert p.prefill.at(256) == pytest.approx(20.0)
    assert p.kv_transfer_ms == pytest.approx(12.0) and p.kv_source == "ttft_breakdown legs"
    # Without the legs, as before: the fastest request less the bytes' time and the first step.
    bare = [o.__class__(**(o.__dict__ | {"prefill_leg_ms": None, "decode_leg_ms": None})) for o in obs]
    q = fit_profile(bare, Path("."), (256, 8192))
    assert (q.prefill.at(256), q.kv_transfer_ms) == pytest.approx((25.0, 2.0))
    # Above C=1 the legs carry queueing: the fastest request again (30 - 2 - 4).
    r = fit_profile(obs[1:], Path("."), (256, 8192))
    assert (r.prefill.at(256), r.kv_transfer_ms) == pytest.approx((24.0, 2.0))


@pytest.mark.parametrize(("polled", "ttfts"), [(False, [26.0, 46.0]), (True, [46.0, 47.0])])
def test_a_polled_hand_off_waits_for_the_prefill_batch_after_it(polled: bool, ttfts: list[float]) -> None:
    # Two prompts at once, one a batch (20 ms each), KV 5 ms, decode 1 ms a step. The first ends
    # at 20 ms; polled, its hand-off waits out the second's batch (to 40 ms), as a NIXL read from
    # a busy prefill without the progress thread does: both reach decode at 45 ms, one joining
    # the step the other started.
    cfg = SimConfig(
        "disagg", 2, 16, 2, 1, 1, lambda t: 20.0 * t / 16, lambda b: 1.0,
        kv_ms=5.0, max_batched_tokens=16, requests=2, kv_polled=polled,
    )  # fmt: skip
    assert sorted(simulate(cfg).ttft_ms) == pytest.approx(ttfts)


def test_the_event_bound_holds() -> None:
    cfg = SimConfig("agg", 4, 16, 1000, 1, 0, lambda t: 1.0, lambda b: 1.0, requests=1000, max_events=500)
    assert simulate(cfg).truncated


@pytest.fixture(scope="module")
def mock_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep of the aggregated mock at several concurrencies: the run directory's result files."""
    tmp = tmp_path_factory.mktemp("predict")
    return mock_sweep(tmp, tmp / "run", CONCURRENCY)


def test_a_profile_of_the_mock_finds_its_configured_times(mock_run: Path) -> None:
    obs = observations(mock_run)
    assert [o.concurrency for o in obs] == CONCURRENCY and {o.phase for o in obs} == {"agg"}
    # One request at a time: each decodes alone, whatever the concurrency.
    assert [o.decode_batch_seen for o in obs] == pytest.approx([1.0] * len(obs), abs=0.02)
    profile = fit_profile(obs, mock_run, ENGINE)
    # Two-sided: the prompt's time is the mock's TTFT, a step its ITL (the client's own time on top).
    assert TTFT_MS * 0.95 <= profile.prefill.at(16) <= TTFT_MS * 1.25
    assert ITL_MS * 0.9 <= profile.decode_step.at(1) <= ITL_MS * 1.25
    path = mock_run / PERF_PROFILE
    perf_profile.write(path, [profile])
    assert perf_profile.read(path) == [profile]


def test_held_out_concurrencies_are_predicted_within_a_fifth(mock_run: Path) -> None:
    obs = observations(mock_run)
    checked = leave_one_out(obs, mock_run, {"agg": ENGINE})
    assert all(c.predicted is not None for c in checked)
    # The highest concurrency is predicted from the three below it, beyond the profiled range.
    top = checked[-1]
    assert top.observed.concurrency == 8
    for metric in ("p90_ttft_ms", "mean_tpot_ms", "output_tps_per_gpu"):
        err = top.error(metric)
        assert err is not None and abs(err) <= 0.2, (metric, top.pair(metric))
    mae = median_abs_error(checked, "p90_ttft_ms")
    assert mae is not None and mae <= 0.2


def test_the_queue_makes_most_of_the_held_out_ttft(mock_run: Path) -> None:
    # The precondition of the test above: without the queue (service time alone) the prediction
    # would miss by far, so meeting the measured TTFT there takes the queueing term.
    obs = observations(mock_run)
    profile = fit_profile(obs[:3], mock_run, ENGINE)
    measured = obs[3].ttft_ms["p90"]
    assert profile.overhead_ms + profile.prefill.at(16) < 0.2 * measured
    assert abs(predict(profile, Deployment.of(profile), 8, 16, OSL).ttft_ms["p90"] / measured - 1) <= 0.2


def test_a_run_without_results_is_refused_by_name(tmp_path: Path) -> None:
    from harness.predict.observe import ObservationError

    with pytest.raises(ObservationError, match=str(tmp_path)):
        observations(tmp_path)
    bad = tmp_path / "perf_profile.json"
    bad.write_text(json.dumps({"format": 1, "profiles": [{"phase": "agg"}]}))
    with pytest.raises(perf_profile.ProfileError, match=r"perf_profile\.json: profiles\.0\.prefill"):
        perf_profile.read(bad)


def _cli(*args: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from harness.cli import app

    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


def test_pdbench_predict_answers_per_concurrency_without_running(mock_run: Path) -> None:
    rc, out = _cli(
        "predict",
        "tiny-fp32-cpu-nixl-1p2d-vs-agg",
        "--set",
        "topology.aggregated_only=true",
        "--set",
        "benchmark.concurrency=[1,8,64]",
        "--set",
        f"benchmark.shapes=[16x{OSL}]",
        "--from",
        str(mock_run),
    )
    assert rc == 0, out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("16/")]
    assert [int(r[1]) for r in rows] == [1, 8, 64]
    assert rows[0][-1] == "no"  # within what the run measured
    assert "outside the profiled" in " ".join(rows[-1])  # 64 clients: beyond it, and said so


def test_pdbench_predict_names_what_is_missing(mock_run: Path, tmp_path: Path) -> None:
    rc, out = _cli("predict", "tiny-fp32-cpu-nixl-1p2d", "--from", str(mock_run))
    assert rc == 2 and "topology.prefill/decode: no run of" in out and "measured disagg serving" in out
    rc, out = _cli("predict", "tiny-fp32-cpu-nixl-1p2d", "--from", str(tmp_path / "nope"))
    assert rc == 2 and f"--from {tmp_path / 'nope'}: no such run directory" in out


def test_the_report_shows_predicted_against_measured(mock_run: Path) -> None:
    rc, out = _cli("report", str(mock_run), "--predict", "--format", "md")
    assert rc == 0, out
    section = out.split("## Predicted against measured")[1]
    rows = [line for line in section.splitlines() if line.startswith("| run")]
    assert len(rows) == 1 + len(CONCURRENCY)  # the header and one row per point
    assert "median absolute error over 4 held-out point(s)" in section


def test_cpu_workers_bound_to_one_core_are_one_device_group() -> None:
    two_prefill = ["topology.prefill.workers=2", "topology.prefill.nodes=2"]
    rr = load_recipe("tiny-fp32-cpu-nixl-1p2d", two_prefill, cluster="local")  # prefill on core 0, decode on 1
    assert [w.cpu_bind for w in plan(rr).role("prefill")] == ["0", "0"]  # the precondition
    assert (device_groups(rr, "prefill"), device_groups(rr, "decode")) == ((0, 0), (0, 0))
    unbound = load_recipe("tiny-fp32-cpu-nixl-1p2d", [*two_prefill, "topology.prefill.cpu_bind=[]"], cluster="local")
    assert device_groups(unbound, "prefill") == (0, 1)  # no binding: each worker its own
    (target, *_) = targets(rr)
    assert (target.deployment.prefill_groups, target.deployment.decode_groups) == ((0, 0), (0, 0))


def test_a_connector_without_its_progress_thread_hands_off_when_prefill_polls(tmp_path: Path) -> None:
    rr = load_recipe("tiny-fp32-cpu-nixl-1p2d", [], cluster="local")
    assert rr.recipe.connector.progress_thread is False  # the CPU recipes' setting
    assert targets(rr)[0].deployment.kv_polled
    threaded = load_recipe("tiny-fp32-cpu-nixl-1p2d", ["connector.progress_thread=true"], cluster="local")
    assert not targets(threaded)[0].deployment.kv_polled
    # A run says it in its lock; a run without one is taken as threaded.
    assert not kv_polled(tmp_path)
    (tmp_path / "recipe.lock.yaml").write_text(json.dumps({"recipe": {"connector": {"progress_thread": False}}}))
    assert kv_polled(tmp_path)


def test_cpu_servers_get_vllms_cpu_defaults_where_the_recipe_sets_none() -> None:
    # The local recipes set max-num-seqs 64 and no batch-token limit: vLLM's CPU platform then
    # batches 2048 tokens (x its TP), not the GPU servers' 8192.
    cpu = load_recipe("tiny-fp32-cpu-nixl-1p2d", [], cluster="local")
    assert cpu.recipe.topology.gpus_per_node == 0  # the precondition: CPU-only nodes
    (target, *_) = targets(cpu)
    assert (target.max_num_seqs, target.max_batched_tokens) == (64, 2048)
    topology = {"gpus_per_node": 0, "prefill": {"tp": 2}, "decode": {"tp": 1}}
    assert limits({}, topology, "disagg") == (128, 4096)
    assert limits({}, {**topology, "gpus_per_node": 8}, "disagg") == (256, 8192)
    assert limits({}, {"gpus_per_node": 0, "aggregated": {"tp": 1}}, "agg") == (128, 2048)
