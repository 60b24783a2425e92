"""aiperf's command line for one concurrency point, from the sweep's settings.

The flags follow InferenceX's agentic job (benchmarks/benchmark_lib.sh, build_replay_cmd): a
streaming chat or completions endpoint, the served model and the real tokenizer, server-side
token counts, no GPU telemetry, each vLLM server's /metrics, and the artifacts in
aiperf_artifacts/ where process_agentic_result.py looks for them.
"""

from __future__ import annotations

import math
from pathlib import Path

from harness.bench.client_config import ClientConfig
from harness.bench.dataset import Convention, length_bounds
from harness.bench.validity_probe import parse_target
from harness.config.checkout import in_checkout
from harness.rundir.paths import AIPERF_ARTIFACTS

# InferenceX's scenario refuses a shorter duration unless it runs with --unsafe-override (which
# marks the run's aggregate submission_valid=false): a smoke test's point is that.
SCENARIO_MIN_DURATION_S = 900.0
# InferenceX's warmup start window and trace idle cap (build_replay_cmd).
TRAJECTORY_START = ("0.25", "0.75")
FAILED_REQUEST_THRESHOLD = "0.10"


def aiperf_argv(cfg: ClientConfig, concurrency: int, point_dir: Path) -> list[str]:
    a = cfg.aiperf
    argv = [
        str(in_checkout(a.executable)),  # relative: scripts/setup.sh's .venv-aiperf, wherever the job runs
        "profile",
        "--url",
        cfg.base_url,
        "--endpoint-type",
        cfg.endpoint,
        "--streaming",
        "--model",
        cfg.model,
        "--tokenizer",
        cfg.tokenizer,
        "--concurrency",
        str(concurrency),
        "--random-seed",
        str(cfg.seed),
        "--use-server-token-count",
        "--no-gpu-telemetry",
        "--ui-type",
        "none",
        "--output-artifact-dir",
        str(point_dir / AIPERF_ARTIFACTS),
    ]
    if cfg.ignore_eos:
        argv += ["--extra-inputs", "ignore_eos:true"]
    if urls := [f"{parse_target(t)[2]}/metrics" for t in cfg.scrape]:
        argv += ["--server-metrics", *urls]
    argv += _load(cfg, concurrency)
    return argv + list(a.extra_args)


def _load(cfg: ClientConfig, concurrency: int) -> list[str]:
    """What aiperf sends: an agentic trace, or the sweep's own dataset."""
    a = cfg.aiperf
    if a.trace_source is not None:
        assert a.benchmark_duration_s is not None  # AiperfSettings requires it with a trace
        argv = []
        if a.scenario is not None:
            argv += ["--scenario", a.scenario]
        if a.public_dataset is not None:
            argv += ["--public-dataset", a.public_dataset]
        else:
            argv += ["--custom-dataset-type", "weka_trace", "--input-file", str(a.weka_trace)]
        argv += [
            "--benchmark-duration",
            f"{a.benchmark_duration_s:g}",
            "--trajectory-start-min-ratio",
            TRAJECTORY_START[0],
            "--trajectory-start-max-ratio",
            TRAJECTORY_START[1],
            "--failed-request-threshold",
            FAILED_REQUEST_THRESHOLD,
        ]
        if a.scenario is not None and a.benchmark_duration_s < SCENARIO_MIN_DURATION_S:
            argv.append("--unsafe-override")
        return argv
    if cfg.dataset == "mooncake_trace":
        assert cfg.trace is not None and cfg.dataset_path is not None  # BenchmarkSettings sets both
        argv = ["--custom-dataset-type", "mooncake_trace", "--input-file", cfg.dataset_path, "--fixed-schedule"]
        argv += ["--isl-block-size", str(cfg.trace.block_tokens)]
        if cfg.trace.speed != 1.0:  # aiperf divides a trace's timestamps by it, as pdbench's speed does
            argv += ["--synthesis-speedup-ratio", f"{cfg.trace.speed:g}"]
        if cfg.trace.max_requests is not None:
            argv += ["--request-count", str(cfg.trace.max_requests)]
        return argv
    assert cfg.isl is not None and cfg.osl is not None  # check_clients refuses shapes
    argv = [*_lengths(cfg.isl, cfg.osl, cfg.range_ratio, cfg.range_ratio_convention)]
    if cfg.sessions is not None:
        s = cfg.sessions
        argv += [
            "--conversation-num",
            str(s.sessions_for(concurrency)),
            "--conversation-turn-mean",
            str(s.turns),
            "--conversation-turn-stddev",
            "0",
            "--conversation-turn-delay-mean",
            f"{s.think_time_s * 1000:g}",
        ]
        if warm := s.warmup_sessions_for(concurrency):
            argv += ["--warmup-request-count", str(warm * s.turns)]
        return argv
    argv += ["--request-count", str(cfg.num_prompts_for(concurrency))]
    if warm := cfg.num_warmups_for(concurrency):
        argv += ["--warmup-request-count", str(warm)]
    if not math.isinf(cfg.request_rate):
        argv += ["--request-rate", f"{cfg.request_rate:g}"]
    return argv


def _lengths(isl: int, osl: int, ratio: float, convention: Convention) -> list[str]:
    """The sweep's length window as aiperf's: its sglang style is pdbench's inferencex one."""
    argv = ["--isl", str(isl), "--isl-stddev", "0", "--osl", str(osl), "--osl-stddev", "0"]
    if length_bounds(isl, ratio, convention) == (isl, isl) and length_bounds(osl, ratio, convention) == (osl, osl):
        return argv
    style = "sglang" if convention == "inferencex" else "vllm"
    return [*argv, "--random-range-ratio", f"{ratio:g}", "--random-corpus-style", style]
