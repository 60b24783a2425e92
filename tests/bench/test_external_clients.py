"""Other clients in the same job (aiperf, `vllm bench serve`): the settings' checks, the command
lines built from a sweep's settings, where their artifacts go, the bounded run of one point, and
the contract with InferenceX's utils/agentic/aggregation/process_agentic_result.py.

The contract, written down from InferenceX at 843c6254 (benchmarks/benchmark_lib.sh and the
aggregation package): for each point InferenceX makes RESULT_DIR=<base>/conc_<C> and runs aiperf
with `--output-artifact-dir $RESULT_DIR/aiperf_artifacts`; process_agentic_result.py takes
RESULT_DIR, looks for `aiperf_artifacts/profile_export.jsonl` (or one level below it), reads that
file's records (`metadata.benchmark_phase`, `metadata.request_end_ns`, `error`, and
`metrics.<name>.value` for time_to_first_token, request_latency, inter_token_latency,
output_sequence_length), `profile_export_aiperf.json` if present (its `metadata.dataset`), and
`server_metrics_export.json` (the servers' Prometheus series), and writes
$AGENTIC_OUTPUT_DIR/$RESULT_FILENAME.json. pdbench's point directory is that RESULT_DIR.
"""

from __future__ import annotations

import itertools
import json
import shlex
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers.external_clients import AGENTIC_READS
from pydantic import ValidationError

import harness
from harness.bench.client_config import ClientConfig
from harness.bench.dataset import length_bounds
from harness.bench.external.aiperf_command import aiperf_argv
from harness.bench.external.point_processes import clients_to_run, phase_of, run_bounded, run_external_clients
from harness.bench.external.vllm_command import random_lengths, vllm_argv
from harness.config.benchmark import BenchmarkSettings
from harness.config.external_clients import AiperfSettings
from harness.rundir.paths import AIPERF_ARTIFACTS, CLIENT_COMMAND, CLIENT_RUN, VLLM_BENCH_RESULT, RunDir

pytestmark = pytest.mark.timeout(60)


def _cfg(tmp_path: Path, **kw: object) -> ClientConfig:
    base: dict[str, object] = dict(
        base_url="http://127.0.0.1:30000",
        model="tiny",
        tokenizer="/models/tiny",
        result_dir=str(tmp_path),
        isl=256,
        osl=32,
        range_ratio=1.0,
        concurrency=[1, 4],
        scrape=["prefill-0=prefill@http://10.0.0.1:8100", "decode-0=decode@http://10.0.0.2:8200"],
    )
    return ClientConfig.model_validate(base | kw)


def _after(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} not in {shlex.join(argv)}"
    return argv[argv.index(flag) + 1]


# --- the settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"cross_check": ["vllm", "vllm"]}, "cross_check: a client is named twice"),
        ({"client": "vllm", "cross_check": ["vllm"]}, "'vllm' is already the sweep's client"),
        ({"client": "vllm", "dataset": "sessions"}, "client: `vllm bench serve` cannot send dataset 'sessions'"),
        ({"cross_check": ["aiperf"], "dataset": "jsonl", "dataset_path": "x.jsonl"}, "cross_check: aiperf cannot"),
        (
            {"cross_check": ["vllm"], "isl": None, "osl": None, "shapes": [{"isl": 8, "osl": 2}]},
            "takes one isl/osl, not shapes",
        ),
        ({"client": "pytorch"}, "client"),
    ],
)
def test_a_sweep_an_external_client_cannot_send_is_refused(settings: dict, message: str) -> None:
    base = {"isl": 64, "osl": 8, "concurrency": [1]}
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BenchmarkSettings.model_validate(base | settings)


def test_aiperf_trace_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="give one trace source, not both"):
        AiperfSettings(public_dataset="x", weka_trace="/t", benchmark_duration_s=60)
    with pytest.raises(ValidationError, match="replays a trace: set public_dataset or weka_trace"):
        AiperfSettings(scenario="inferencex-agentx-mvp")
    with pytest.raises(ValidationError, match="benchmark_duration_s: a trace source is replayed for a duration"):
        AiperfSettings(weka_trace="/t")
    with pytest.raises(ValidationError, match="executable may not be empty"):
        AiperfSettings(executable=" ")
    # A trace replaces the sweep's dataset, so a dataset aiperf could not send is fine then.
    s = BenchmarkSettings.model_validate(
        {"isl": 64, "osl": 8, "concurrency": [1], "dataset": "jsonl", "dataset_path": "p.jsonl", "client": "aiperf"}
        | {"aiperf": {"weka_trace": "/t", "benchmark_duration_s": 60}}
    )
    assert s.aiperf.trace_source == "/t"


def test_the_main_client_runs_first_then_the_cross_checks(tmp_path: Path) -> None:
    assert clients_to_run(_cfg(tmp_path)) == []
    assert clients_to_run(_cfg(tmp_path, cross_check=["vllm", "aiperf"])) == ["vllm", "aiperf"]
    assert clients_to_run(_cfg(tmp_path, client="aiperf", cross_check=["vllm"])) == ["aiperf", "vllm"]
    assert phase_of(_cfg(tmp_path)) == "disagg"
    assert phase_of(_cfg(tmp_path, gpus=2)) == "aggregated"


# --- the command lines ---------------------------------------------------------------------


def test_vllm_bench_serve_sends_the_sweeps_load(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, num_prompts=40, num_warmups=3, seed=7, ignore_eos=True, endpoint="chat")
    point = RunDir(tmp_path).client_point("vllm", 4)
    argv = vllm_argv(cfg, 4, point)
    assert argv[1:3] == ["bench", "serve"]
    assert Path(argv[0]).name == "vllm"
    assert _after(argv, "--backend") == "openai-chat" and _after(argv, "--endpoint") == "/v1/chat/completions"
    assert _after(argv, "--base-url") == "http://127.0.0.1:30000" and _after(argv, "--model") == "tiny"
    assert _after(argv, "--tokenizer") == "/models/tiny"
    assert _after(argv, "--max-concurrency") == "4" and _after(argv, "--num-prompts") == "40"
    assert _after(argv, "--num-warmups") == "3" and _after(argv, "--seed") == "7"
    assert _after(argv, "--request-rate") == "inf" and "--ignore-eos" in argv
    assert _after(argv, "--dataset-name") == "random"
    # range_ratio 1.0 in InferenceX's convention is exact lengths: vLLM's ratio 0.
    assert (_after(argv, "--random-input-len"), _after(argv, "--random-output-len")) == ("256", "32")
    assert float(_after(argv, "--random-range-ratio")) == 0.0
    assert _after(argv, "--result-dir") == str(point) and _after(argv, "--result-filename") == VLLM_BENCH_RESULT
    assert point == tmp_path / "clients" / "vllm" / "conc_4"


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.8, 1.0])
def test_vllm_length_window_equals_pdbench_inferencex_window(ratio: float) -> None:
    """vLLM samples [L(1-r), L(1+r)]; the mapped arguments give pdbench's [rL, L] (rounded)."""
    args = random_lengths(1000, 200, ratio, "inferencex")
    mean, r = int(args[1]), float(args[5])
    lo, hi = length_bounds(1000, ratio, "inferencex")
    assert abs(mean * (1 - r) - lo) <= 1 and abs(mean * (1 + r) - hi) <= 1
    assert random_lengths(1000, 200, ratio, "vllm")[1::2] == ["1000", "200", f"{ratio:g}"]


def test_aiperf_sends_random_lengths_as_pdbench(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, cross_check=["aiperf"], num_prompts=12, num_warmups=2, ignore_eos=True)
    point = RunDir(tmp_path).client_point("aiperf", 1)
    argv = aiperf_argv(cfg, 1, point)
    assert argv[:2] == [str(Path(harness.__file__).resolve().parents[1] / ".venv-aiperf/bin/aiperf"), "profile"]
    assert _after(argv, "--url") == "http://127.0.0.1:30000" and _after(argv, "--endpoint-type") == "completions"
    assert "--streaming" in argv and "--use-server-token-count" in argv and "--no-gpu-telemetry" in argv
    assert _after(argv, "--concurrency") == "1" and _after(argv, "--request-count") == "12"
    assert _after(argv, "--warmup-request-count") == "2"
    assert (_after(argv, "--isl"), _after(argv, "--osl")) == ("256", "32")
    assert _after(argv, "--isl-stddev") == "0" and "--random-range-ratio" not in argv  # exact lengths
    assert _after(argv, "--extra-inputs") == "ignore_eos:true"
    # Every vLLM server's /metrics, as InferenceX passes AIPERF_SERVER_METRICS_URLS.
    at = argv.index("--server-metrics")
    assert argv[at + 1 : at + 3] == ["http://10.0.0.1:8100/metrics", "http://10.0.0.2:8200/metrics"]
    assert _after(argv, "--output-artifact-dir") == str(point / AIPERF_ARTIFACTS)
    # A spread window in InferenceX's convention is aiperf's sglang style, [rL, L].
    spread = aiperf_argv(_cfg(tmp_path, cross_check=["aiperf"], range_ratio=0.5), 1, point)
    assert _after(spread, "--random-range-ratio") == "0.5" and _after(spread, "--random-corpus-style") == "sglang"


def test_aiperf_sends_sessions_and_traces(tmp_path: Path) -> None:
    point = RunDir(tmp_path).client_point("aiperf", 2)
    sessions = _cfg(
        tmp_path,
        client="aiperf",
        dataset="sessions",
        sessions={"turns": 3, "think_time_s": 0.5, "num_sessions": 6, "num_warmup_sessions": 1},
    )
    argv = aiperf_argv(sessions, 2, point)
    assert _after(argv, "--conversation-num") == "6" and _after(argv, "--conversation-turn-mean") == "3"
    assert _after(argv, "--conversation-turn-stddev") == "0" and _after(argv, "--conversation-turn-delay-mean") == "500"
    assert _after(argv, "--warmup-request-count") == "3" and "--request-count" not in argv
    trace = _cfg(
        tmp_path,
        client="aiperf",
        dataset="mooncake_trace",
        dataset_path="/traces/t.jsonl",
        trace={"speed": 2.0, "max_requests": 50},
    )
    argv = aiperf_argv(trace, 2, point)
    assert (
        _after(argv, "--custom-dataset-type") == "mooncake_trace" and _after(argv, "--input-file") == "/traces/t.jsonl"
    )
    assert "--fixed-schedule" in argv and _after(argv, "--synthesis-speedup-ratio") == "2"
    assert _after(argv, "--isl-block-size") == "512" and _after(argv, "--request-count") == "50"


def test_aiperf_runs_inferencex_agentic_scenario_as_inferencex_does(tmp_path: Path) -> None:
    point = RunDir(tmp_path).client_point("aiperf", 8)
    agentic = {"scenario": "inferencex-agentx-mvp", "weka_trace": "/traces/weka", "benchmark_duration_s": 60}
    argv = aiperf_argv(_cfg(tmp_path, client="aiperf", aiperf=agentic, endpoint="chat"), 8, point)
    assert _after(argv, "--scenario") == "inferencex-agentx-mvp" and _after(argv, "--endpoint-type") == "chat"
    assert _after(argv, "--custom-dataset-type") == "weka_trace" and _after(argv, "--input-file") == "/traces/weka"
    assert _after(argv, "--benchmark-duration") == "60" and "--request-count" not in argv
    assert (_after(argv, "--trajectory-start-min-ratio"), _after(argv, "--trajectory-start-max-ratio")) == (
        "0.25",
        "0.75",
    )
    assert "--unsafe-override" in argv  # under the scenario's 900 s, as InferenceX's smoke runs
    full = {"scenario": "inferencex-agentx-mvp", "public_dataset": "semianalysis_cc_traces_weka_062126_256k"}
    argv = aiperf_argv(_cfg(tmp_path, client="aiperf", aiperf=full | {"benchmark_duration_s": 1800}), 8, point)
    assert _after(argv, "--public-dataset") == "semianalysis_cc_traces_weka_062126_256k"
    assert "--unsafe-override" not in argv and "--custom-dataset-type" not in argv


def test_aiperf_artifacts_land_where_process_agentic_result_reads_them(tmp_path: Path) -> None:
    """The point directory is InferenceX's RESULT_DIR: the script's artifact lookup
    (_resolve_artifact_dir, written down above) finds aiperf's files under it."""
    run = RunDir(tmp_path)
    point = run.client_point("aiperf", 4)
    artifacts = Path(_after(aiperf_argv(_cfg(tmp_path, client="aiperf"), 4, point), "--output-artifact-dir"))
    assert artifacts.parent == point and point.name == "conc_4"  # InferenceX: ${BASE_RESULT_DIR}/conc_${C}
    for name in AGENTIC_READS:
        assert (point / name).parent == artifacts
    assert run.client_point("aiperf", 4, "aggregated") == tmp_path / "clients" / "aggregated" / "aiperf" / "conc_4"


# --- the bounded run --------------------------------------------------------------------------


def test_a_point_that_runs_past_its_timeout_is_stopped_with_its_children(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "x.log"
    pids = tmp_path / "pids"
    child = f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); open({str(pids)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)"
    t0 = time.monotonic()
    assert run_bounded([sys.executable, "-c", child], log, timeout_s=3) is None
    assert time.monotonic() - t0 < 30
    grandchild = int(pids.read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the client's child outlived the stopped point"
        time.sleep(0.1)
    assert "started" in log.read_text()


def test_a_client_that_cannot_start_is_a_failed_point_with_the_reason(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "y.log"
    assert run_bounded([str(tmp_path / "no-such-aiperf"), "profile"], log, timeout_s=5) == 127
    assert "cannot run" in log.read_text() and "No such file" in log.read_text()


def test_every_point_keeps_its_command_log_and_run_record(tmp_path: Path) -> None:
    """A client that is not installed fails each point, says why, and never writes over a point."""
    cfg = _cfg(tmp_path, cross_check=["aiperf"], aiperf={"executable": str(tmp_path / "missing")})
    outcomes = run_external_clients(cfg)
    assert [(o.client, o.concurrency, o.returncode, o.ok) for o in outcomes] == [
        ("aiperf", 1, 127, False),
        ("aiperf", 4, 127, False),
    ]
    run = RunDir(tmp_path)
    for o in outcomes:
        assert o.point_dir == run.client_point("aiperf", o.concurrency)
        assert shlex.split((o.point_dir / CLIENT_COMMAND).read_text())[0] == str(tmp_path / "missing")
        record = json.loads((o.point_dir / CLIENT_RUN).read_text())
        assert record["returncode"] == 127 and record["wall_s"] >= 0 and record["cpu_s"] >= 0
        assert o.log == run.logs / f"aiperf-conc_{o.concurrency}.log" and "cannot run" in o.log.read_text()
        assert f"C={o.concurrency}" in o.summary and str(o.log) in o.summary
    assert sorted(run.client_points("aiperf")) == [1, 4]
    with pytest.raises(FileExistsError):
        run_external_clients(cfg)


def test_the_real_vllm_command_is_found_beside_pdbench() -> None:
    from harness.bench.external.vllm_command import vllm_executable

    found = vllm_executable("vllm")
    beside = Path(sys.executable).parent / "vllm"
    if beside.is_file():
        assert found == str(beside)
    assert vllm_executable("/opt/x/vllm") == "/opt/x/vllm"


def test_aiperf_gets_the_hub_online_for_a_local_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job runs offline (HF_HUB_OFFLINE=1); aiperf 0.13.0 then looks a tokenizer up in the hub's
    cache only and fails on a local directory, which needs no hub: its environment drops the flag."""
    from harness.bench.external.point_processes import client_env

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    local = _cfg(tmp_path, tokenizer=str(tmp_path))
    assert "HF_HUB_OFFLINE" not in client_env("aiperf", local)
    assert client_env("vllm", local)["HF_HUB_OFFLINE"] == "1"
    assert client_env("aiperf", _cfg(tmp_path, tokenizer="org/model"))["HF_HUB_OFFLINE"] == "1"


def test_the_clients_cpu_is_sampled_each_second(tmp_path: Path) -> None:
    timeline: list[tuple[float, float]] = []
    burn = "import time; end = time.time() + 2.5\nwhile time.time() < end: pass"
    assert run_bounded([sys.executable, "-c", burn], tmp_path / "b.log", timeout_s=20, timeline=timeline) == 0
    assert len(timeline) >= 2, timeline
    assert all(b[0] > a[0] and b[1] >= a[1] for a, b in itertools.pairwise(timeline))
    assert timeline[-1][1] > timeline[0][1]  # it burnt CPU (how much depends on the machine's load)


def test_resume_keeps_finished_points_and_reruns_the_others(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, cross_check=["aiperf"], aiperf={"executable": str(tmp_path / "missing")})
    run = RunDir(tmp_path)
    first = run_external_clients(cfg)
    # C=1 finished in that run; C=4 did not.
    (run.client_point("aiperf", 1) / CLIENT_RUN).write_text(json.dumps({"returncode": 0, "wall_s": 1, "cpu_s": 1}))
    again = run_external_clients(cfg.model_copy(update={"resume": True}))
    assert [(o.concurrency, o.returncode) for o in again] == [(1, 0), (4, 127)]
    assert again[0].point_dir == first[0].point_dir and again[0].log == first[0].log
    (moved,) = (run.superseded / "clients" / "aiperf").iterdir()
    assert moved.name.startswith("conc_4-") and json.loads((moved / CLIENT_RUN).read_text())["returncode"] == 127
    assert json.loads((run.client_point("aiperf", 4) / CLIENT_RUN).read_text())["returncode"] == 127  # ran again
