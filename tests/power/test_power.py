"""GPU power: the sampler against test doubles of its sources (a fake nvidia-smi, amd-smi and
pynvml that replay fixed readings), and each point's energy and cost from samples."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.power_fakes import FAKE_AMD_SMI, FAKE_NVIDIA_SMI, FAKE_PYNVML, GPUS, fake_bin

from harness.config import load_recipe
from harness.config.load import ConfigError
from harness.power import package
from harness.power.account import wait_for_samplers
from harness.power.energy import (
    MAX_SAMPLE_GAP_S,
    Cost,
    Gpu,
    GroupPower,
    PointPower,
    Prices,
    Tokens,
    integrate,
    largest_gap,
    point_power,
)
from harness.report.build import build_report
from harness.rundir import RunDir
from harness.rundir.power_samples import Sample, SamplerRecord, read, read_record, write_record

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


# --- energy from samples -------------------------------------------------------------------------


def test_integrate_interpolates_the_window_ends() -> None:
    pts = [(0.0, 100.0), (1.0, 200.0), (2.0, 100.0)]
    # 150 W at 0.5 s and 1.5 s (interpolated), 200 W at 1 s: two trapezoids of 87.5 J
    assert integrate(pts, 0.5, 1.5) == pytest.approx(175.0)
    assert integrate(pts, 0.0, 2.0) == pytest.approx(300.0)
    assert largest_gap([0.0, 1.0, 2.0], 0.5, 1.5) == 1.0
    assert largest_gap([1.0, 2.0], 0.5, 1.5) is None  # nothing at or before the start


def _series(node: int, index: int, uuid: str, watts, t_end: float = 10.0, step: float = 0.25, energy=None):
    out = []
    t = 0.0
    while t <= t_end + 1e-9:
        out.append(Sample(t, "host", index, uuid, watts(t), None if energy is None else energy(t)))
        t = round(t + step, 6)
    return out


PREFILL = Gpu(0, "host", 0, "GPU-p", "prefill-0", "prefill")
DECODE = Gpu(0, "host", 1, "GPU-d", "decode-0", "decode")


def _spike(t: float) -> float:
    return 900.0 if abs(t - 4.0) < 1e-9 else 500.0


def test_point_energy_and_cost_per_role() -> None:
    samples = {
        (0, 0): _series(0, 0, "GPU-p", lambda t: 300.0, energy=lambda t: 1000.0 + 300.0 * t),
        (0, 1): _series(0, 1, "GPU-d", _spike),
    }
    p = point_power(
        "r.json",
        "disagg",
        (2.0, 6.0),
        Tokens(completed=10, input=4000, output=1000),
        [PREFILL, DECODE],
        samples,
        Prices(gpu_hour_usd=3.6, kwh_usd=0.36),
    )
    assert p.power_valid is True and p.reasons == [] and p.duration_s == 4.0
    pre, dec = p.roles["prefill"], p.roles["decode"]
    assert pre.energy_j == pytest.approx(1200.0) and pre.mean_w == pytest.approx(300.0) and pre.peak_w == 300.0
    assert pre.j_per_input_token == pytest.approx(0.3) and pre.j_per_output_token is None
    assert pre.counter_energy_j == pytest.approx(1200.0)  # the GPU's own counter agrees
    # 500 W for 4 s plus the spike's triangle (0.5 s wide, 400 W high): 2100 J
    assert dec.energy_j == pytest.approx(2100.0) and dec.peak_w == 900.0 and dec.counter_energy_j is None
    assert dec.j_per_output_token == pytest.approx(2.1) and dec.j_per_request == pytest.approx(210.0)
    assert p.total is not None and p.total.energy_j == pytest.approx(3300.0) and p.total.gpus == 2
    assert p.servers["prefill-0"].energy_j == pytest.approx(1200.0)
    assert p.max_sample_gap_s == {"host/gpu0": 0.25, "host/gpu1": 0.25}
    c = p.cost
    assert c is not None and c.gpus == 2
    assert c.gpu_time_usd == pytest.approx(3.6 * 2 * 4 / 3600)  # $0.008
    assert c.energy_usd == pytest.approx(3300 / 3.6e6 * 0.36)
    assert c.usd_per_mtok_output == pytest.approx((0.008 + 0.00033) / 1000 * 1e6)
    assert c.prefill_usd_per_mtok_input == pytest.approx((0.004 + 1200 / 3.6e6 * 0.36) / 4000 * 1e6)
    assert c.decode_usd_per_mtok_output == pytest.approx((0.004 + 2100 / 3.6e6 * 0.36) / 1000 * 1e6)


def test_a_gap_beyond_the_bound_makes_the_point_invalid_with_its_reason() -> None:
    decode = [s for s in _series(0, 1, "GPU-d", lambda t: 500.0) if not 3.0 < s.timestamp_unix < 6.5]
    samples = {(0, 0): _series(0, 0, "GPU-p", lambda t: 300.0), (0, 1): decode}
    p = point_power("r.json", "disagg", (2.0, 6.0), Tokens(1, 1, 1), [PREFILL, DECODE], samples, Prices(2.0))
    assert p.power_valid is False and p.total is None and p.roles == {}
    assert p.reasons == [f"host/gpu1 (decode-0): a 3.50 s gap between samples (bound {MAX_SAMPLE_GAP_S} s)"]
    # GPU time is still known and priced; no energy is invented
    assert p.cost is not None and p.cost.gpu_time_usd == pytest.approx(2.0 * 2 * 4 / 3600) and p.cost.energy_usd is None


def test_a_window_outside_the_samples_is_not_bracketed() -> None:
    samples = {(0, 0): _series(0, 0, "GPU-p", lambda t: 300.0, t_end=5.0)}
    p = point_power("r.json", "disagg", (2.0, 6.0), Tokens(1, 1, 1), [PREFILL], samples, Prices())
    assert p.power_valid is False and p.reasons == ["host/gpu0 (prefill-0): the window is not bracketed by samples"]
    assert p.cost is None  # no price given


def test_missing_telemetry_is_missing_never_zero() -> None:
    p = point_power(
        "r.json",
        "disagg",
        (2.0, 6.0),
        Tokens(1, 1, 1),
        [],
        {},
        Prices(gpu_hour_usd=2.0, kwh_usd=0.1),
        missing="node 0 (prefill-0): telemetry missing: nvidia-smi is not on PATH",
        role_gpus={"prefill": 1, "decode": 1},
    )
    assert p.power_valid is None and p.total is None and p.roles == {}
    assert p.missing == "node 0 (prefill-0): telemetry missing: nvidia-smi is not on PATH"
    # The GPU-hours are priced from the plan's GPUs; the energy's price has no energy: no total.
    assert p.cost is not None and p.cost.gpus == 2 and p.cost.gpu_time_usd == pytest.approx(2.0 * 2 * 4 / 3600)
    assert p.cost.usd is None and "energy is missing" in p.cost.note
    assert "0.0" not in json.dumps(p.model_dump(include={"total", "roles"}))


# --- the sampler against its sources' doubles ------------------------------------------------------


def _env(path_dirs: list[Path], *pythonpath: Path) -> dict[str, str]:
    # PATH: the doubles and the system's basics only, so no real SMI is found; PYTHONPATH: a
    # pynvml double or one that is not importable, so the real library is never reached.
    return dict(
        os.environ,
        PATH=os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"]),
        PYTHONPATH=os.pathsep.join([*map(str, pythonpath), str(ROOT)]),
    )


@pytest.fixture
def no_pynvml(tmp_path: Path) -> Path:
    """pynvml not importable; nor pydantic: the sampler runs in a node's interpreter, which may
    have the standard library alone (the H200 machine's Python has pynvml and no pydantic)."""
    d = tmp_path / "no-pynvml"
    d.mkdir()
    for name in ("pynvml", "pydantic"):
        (d / f"{name}.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\")\n")
    return d


def _selftest(env: dict[str, str], seconds: float = 0.6) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.power.sampler", "--selftest", str(seconds), "--interval", "0.1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_selftest_without_any_source_says_missing(tmp_path: Path, no_pynvml: Path) -> None:
    r = _selftest(_env([tmp_path / "empty"], no_pynvml))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("missing: nvml: pynvml is not importable"), r.stdout
    assert "nvidia-smi: nvidia-smi is not on PATH" in r.stdout and "amd-smi: amd-smi is not on PATH" in r.stdout


@pytest.mark.parametrize("source", ["nvidia-smi", "amd-smi", "nvml"])
def test_selftest_prints_each_sources_readings(tmp_path: Path, no_pynvml: Path, source: str) -> None:
    bin_dir, pythonpath = tmp_path / "bin", [no_pynvml]
    if source == "nvidia-smi":
        fake_bin(bin_dir, "nvidia-smi", FAKE_NVIDIA_SMI)
    elif source == "amd-smi":
        fake_bin(bin_dir, "amd-smi", FAKE_AMD_SMI)
    else:
        pythonpath.insert(0, tmp_path / "fake-nvml")
        pythonpath[0].mkdir()
        (pythonpath[0] / "pynvml.py").write_text(FAKE_PYNVML)
    r = _selftest(_env([bin_dir], *pythonpath))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"source: {source}"), r.stdout
    readings = [ln.split() for ln in lines[1:-1]]
    assert len(readings) >= 4 and len(readings) % 2 == 0, r.stdout  # two GPUs a tick
    assert {(f[2], f[4]) for f in readings} == {("gpu0", "100.5"), ("gpu1", "200.2")}
    if source == "nvml":
        assert all(f[7] == "J" and float(f[6]) > 0 for f in readings)  # the energy counter beside the power
    assert "ticks in" in lines[-1] and "% of one core" in lines[-1]


def test_node_sampler_appends_until_stopped(tmp_path: Path, no_pynvml: Path) -> None:
    env = _env([fake_bin(tmp_path / "bin", "nvidia-smi", FAKE_NVIDIA_SMI)], no_pynvml)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    t0 = time.time()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.power.sampler",
            "--run-dir",
            str(run.path),
            "--node",
            "3",
            "--interval",
            "0.05",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while len(read(run.power_samples(3))[0]) < 10:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    t1 = time.time()
    rec = read_record(run.power_record(3))
    assert rec is not None and rec.status == "sampling" and rec.backend == "nvidia-smi" and rec.node == 3
    assert rec.gpus == ["0:GPU-aaaa", "1:GPU-bbbb"] and "pynvml is not importable" in rec.reason
    rows, skipped = read(run.power_samples(3))
    assert (
        skipped == [] and b"\r" not in run.power_samples(3).read_bytes()
    )  # plain lines, as the tail reader splits them
    for index, uuid, watts in GPUS:
        mine = [s for s in rows if s.gpu_index == index]
        assert {(s.gpu_uuid, s.power_w) for s in mine} == {(uuid, watts)}
        times = [s.timestamp_unix for s in mine]
        assert times == sorted(times) and len(set(times)) == len(times)
        assert t0 <= times[0] and times[-1] <= t1  # the wall clock, as the client's window


def test_node_sampler_without_telemetry_records_why_and_exits_0(tmp_path: Path, no_pynvml: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "harness.power.sampler", "--run-dir", str(run.path), "--node", "0"],
        env=_env([tmp_path / "empty"], no_pynvml),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    rec = read_record(run.power_record(0))
    assert rec is not None and rec.status == "missing" and rec.backend is None
    assert "nvidia-smi is not on PATH" in rec.reason and "amd-smi is not on PATH" in rec.reason
    assert not run.power_samples(0).exists()  # nothing sampled: no rows, never zeros


# --- the report ----------------------------------------------------------------------------------

FIXTURE_RUN = ROOT / "tests" / "fixtures" / "results" / "tiny-fp32-cpu-nixl-1p1d" / "20261122T032441Z-e8da34"


def _priced(result: str, phase: str, usd_per_mtok_output: float | None, valid: bool | None = True) -> PointPower:
    if valid is None:
        return PointPower(result=result, phase=phase, power_valid=None, missing="nvidia-smi is not on PATH")
    total = GroupPower(gpus=2, energy_j=600.0, mean_w=300.0, peak_w=410.0, j_per_request=12.5)
    roles = {"prefill": total.model_copy(update={"gpus": 1, "j_per_input_token": 0.0123})} if phase == "disagg" else {}
    cost = Cost(gpus=2, gpu_hour_usd=3.0, usd=1.0, usd_per_mtok_output=usd_per_mtok_output)
    return PointPower(result=result, phase=phase, power_valid=True, total=total, roles=roles, cost=cost)


def test_report_shows_energy_cost_and_where_disaggregation_gets_cheaper(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "tiny" / FIXTURE_RUN.name)
    shutil.copytree(FIXTURE_RUN, run.path)
    # the aggregated baseline of the same points (metadata.disagg false, one server's GPUs)
    for disagg_name in run.result_names():
        data = json.loads((run.path / disagg_name).read_text())
        data["metadata"]["disagg"] = False
        (run.path / disagg_name.replace("_gpus_2_ctx_1_gen_1", "_gpus_2")).write_text(json.dumps(data))
    priced = {
        "concurrency_1_req_rate_inf_gpus_2_ctx_1_gen_1.json": ("disagg", 2.0),
        "concurrency_1_req_rate_inf_gpus_2.json": ("aggregated", 1.5),
        "concurrency_4_req_rate_inf_gpus_2_ctx_1_gen_1.json": ("disagg", 0.5),
        "concurrency_4_req_rate_inf_gpus_2.json": ("aggregated", 0.8),
    }
    for name, (phase, usd) in priced.items():
        run.power_point(name).parent.mkdir(parents=True, exist_ok=True)
        run.power_point(name).write_text(_priced(name, phase, usd).model_dump_json())
    report = build_report([run.path])
    # The energy records are named after the results they account, and are no results themselves.
    assert list(run.path.glob("power/points/concurrency_*.json")) and not report.skipped, report.skipped
    [section] = [s for s in report.sections if s.title == "Energy and cost per point"]
    rows = {(r[1], r[3]): dict(zip(section.headers, r, strict=True)) for r in section.rows}
    assert set(rows) == {("disagg", "1"), ("agg", "1"), ("disagg", "4"), ("agg", "4")}
    assert rows[("disagg", "1")]["Power"] == "valid" and rows[("disagg", "1")]["Prefill J/in tok"] == "0.0123"
    assert rows[("disagg", "4")]["$/Mtok out"] == "0.500" and rows[("agg", "4")]["All W mean/peak"] == "300/410"
    assert section.findings == (
        f"{FIXTURE_RUN.name} (ISL 256, OSL 32): disaggregated is cheaper per output token from C=4 on "
        "(C=1 $2.000 vs $1.500, C=4 $0.500 vs $0.800)",
    ), section.findings

    # within an SLO that the C=4 points miss (median TTFT 225 ms), only C=1 is compared
    slo = {"ttft_p50": 100.0}
    [section] = [s for s in build_report([run.path], slo=slo).sections if s.title == "Energy and cost per point"]
    assert section.findings == (
        f"{FIXTURE_RUN.name} (ISL 256, OSL 32): disaggregated is not cheaper per output token at the highest "
        "concurrency compared (C=1 $2.000 vs $1.500)",
    )
    assert section.note.endswith("within the SLO ttft_p50 <= 100).")

    # a point without telemetry says so; it has no cost to compare, so no break-even is claimed
    name = "concurrency_4_req_rate_inf_gpus_2.json"
    run.power_point(name).write_text(_priced(name, "aggregated", None, valid=None).model_dump_json())
    [section] = [s for s in build_report([run.path]).sections if s.title == "Energy and cost per point"]
    row = next(r for r in section.rows if r[1] == "agg" and r[3] == "4")
    assert row[4] == "missing: nvidia-smi is not on PATH" and set(row[5:]) == {"–"}
    assert section.findings == (
        f"{FIXTURE_RUN.name} (ISL 256, OSL 32): disaggregated is not cheaper per output token at the highest "
        "concurrency compared (C=1 $2.000 vs $1.500)",
    )


def test_a_run_without_telemetry_or_prices_is_one_note_not_a_row_a_point(tmp_path: Path) -> None:
    """A CPU cluster's run: every point's record says the telemetry is missing and none has a
    price. The report says so once for the run rather than a row of dashes a point."""
    run = RunDir(tmp_path / "tiny" / FIXTURE_RUN.name)
    shutil.copytree(FIXTURE_RUN, run.path)
    names = run.result_names()
    assert len(names) >= 2
    for name in names:
        run.power_point(name).parent.mkdir(parents=True, exist_ok=True)
        run.power_point(name).write_text(_priced(name, "disagg", None, valid=None).model_dump_json())
    report = build_report([run.path])
    assert len(list(run.path.glob("power/points/concurrency_*.json"))) == len(names)
    assert not [s for s in report.sections if s.title == "Energy and cost per point"]
    said = [n for n in report.notes if "no GPU power and no price" in n]
    assert len(said) == 1 and said[0].endswith("no GPU power and no price on any point (nvidia-smi is not on PATH)"), (
        said
    )

    # one point priced: the run's every point is a row again, the missing ones saying so
    name = names[0]
    run.power_point(name).write_text(_priced(name, "disagg", 1.0).model_dump_json())
    report = build_report([run.path])
    [section] = [s for s in report.sections if s.title == "Energy and cost per point"]
    assert len(section.rows) == len(names) and not [n for n in report.notes if "no GPU power and no price" in n]
    assert sorted(r[4] for r in section.rows)[0] == "missing: nvidia-smi is not on PATH"


# --- prices in the recipe (set by the cluster profile) ---------------------------------------------


def test_prices_are_recorded_in_the_lock_and_kept_out_of_the_fingerprint() -> None:
    plain = load_recipe("llama8b-shape-bf16-h200x2-nixl-1p1d", [])
    priced = load_recipe("llama8b-shape-bf16-h200x2-nixl-1p1d", ["site.gpu_hour_usd=3.0", "site.kwh_usd=0.2"])
    site = priced.locked()["recipe"]["site"]
    assert (site["gpu_hour_usd"], site["kwh_usd"]) == (3.0, 0.2)
    assert "gpu_hour_usd" not in plain.locked()["recipe"]["site"]  # unset: not in the lock at all
    assert priced.fingerprint == plain.fingerprint
    with pytest.raises(ConfigError, match=r"site\.gpu_hour_usd"):
        load_recipe("llama8b-shape-bf16-h200x2-nixl-1p1d", ["site.gpu_hour_usd=-1"])


@pytest.mark.parametrize("interval", ["0.01", "2.5"])
def test_a_sampling_interval_is_off_or_within_the_gap_bound(interval: str) -> None:
    with pytest.raises(
        ConfigError, match=r"benchmark\.validity\.power_interval_s: must be 0 \(off\) or from 0\.05 to 2 s"
    ):
        load_recipe("tiny-fp32-cpu-nixl-1p1d", [f"benchmark.validity.power_interval_s={interval}"])
    assert (
        "power_interval_s" not in load_recipe("tiny-fp32-cpu-nixl-1p1d", []).locked()["recipe"]["benchmark"]["validity"]
    )


def test_node_0_waits_for_this_phases_samplers_not_an_earlier_ones(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    rec = SamplerRecord(status="missing", hostname="h", node=0, interval_s=0.25, started_at_unix=1.0, phase="disagg")
    write_record(run.power_record(0), rec)
    t0 = time.monotonic()
    assert wait_for_samplers(run.path, [0, 1], "aggregated", timeout_s=0.5) == [0, 1]  # bounded
    assert 0.5 <= time.monotonic() - t0 < 5
    assert wait_for_samplers(run.path, [0], "disagg", timeout_s=0.5) == []


def test_a_planned_gpu_without_samples_fails_the_package(tmp_path: Path) -> None:
    samples = {(0, 0): _series(0, 0, "GPU-p", lambda t: 300.0)}
    manifest = package.write(
        tmp_path / "pkg",
        gpus=[PREFILL, DECODE],
        hostnames={0: "host"},
        samples=samples,
        windows=[package.Window("r.json", "disagg", 8, 2.0, 6.0, 4.0)],
        backend="nvml",
        interval_s=0.25,
        request_timeout_s=5.0,
        started_at=0.0,
        stopped_at=10.0,
        producer_commit=None,
        samplers=[],
    )
    assert [d["gpu_index"] for d in manifest["expected_devices"]] == [0, 1]
    assert [d["gpu_index"] for d in manifest["observed_devices"]] == [0]
    assert manifest["window_validations"][0]["reason_codes"] == ["measurement_window_not_bracketed"]
    assert manifest["publication_valid"] is False
    window = json.loads((tmp_path / "pkg" / "windows" / "r.json").read_text())
    assert (window["status"], window["benchmark_start_time_unix"], window["duration"]) == ("completed", 2.0, 4.0)
