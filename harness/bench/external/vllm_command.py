"""`vllm bench serve`'s command line for one concurrency point: the same servers measured by
vLLM's own client with the sweep's lengths, request count, seed and endpoint, for the report's
cross-check table."""

from __future__ import annotations

import math
import os
import shutil
import sys
from pathlib import Path

from harness.bench.client_config import ENDPOINT_PATHS, ClientConfig
from harness.rundir.paths import VLLM_BENCH_RESULT

PERCENTILES = "50,90,99"


def vllm_executable(name: str) -> str:
    """A bare name beside this interpreter first (the .venv that holds vLLM), then on PATH."""
    if os.sep in name:
        return name
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name) or name


def vllm_argv(cfg: ClientConfig, concurrency: int, point_dir: Path) -> list[str]:
    v = cfg.vllm_bench
    assert cfg.isl is not None and cfg.osl is not None  # check_clients refuses shapes
    argv = [
        vllm_executable(v.executable),
        "bench",
        "serve",
        "--backend",
        "openai-chat" if cfg.endpoint == "chat" else "openai",
        "--base-url",
        cfg.base_url,
        "--endpoint",
        ENDPOINT_PATHS[cfg.endpoint],
        "--model",
        cfg.model,
        "--tokenizer",
        cfg.tokenizer,
        "--max-concurrency",
        str(concurrency),
        "--num-prompts",
        str(v.num_prompts or cfg.num_prompts_for(concurrency)),
        "--num-warmups",
        str(cfg.num_warmups_for(concurrency)),
        "--request-rate",
        "inf" if math.isinf(cfg.request_rate) else f"{cfg.request_rate:g}",
        "--burstiness",
        f"{cfg.burstiness:g}",
        "--seed",
        str(cfg.seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        PERCENTILES,
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(point_dir),
        "--result-filename",
        VLLM_BENCH_RESULT,
    ]
    if cfg.ignore_eos:
        argv.append("--ignore-eos")
    if cfg.dataset == "sharegpt":
        argv += ["--dataset-name", "sharegpt", "--dataset-path", str(cfg.dataset_path)]
        argv += ["--sharegpt-output-len", str(cfg.osl)]
    else:
        argv += [
            "--dataset-name",
            "random",
            *random_lengths(cfg.isl, cfg.osl, cfg.range_ratio, cfg.range_ratio_convention),
        ]
        if cfg.random_prefix_len:
            argv += ["--random-prefix-len", str(cfg.random_prefix_len)]
    return argv + list(v.extra_args)


def random_lengths(isl: int, osl: int, ratio: float, convention: str) -> list[str]:
    """vLLM's window is [L(1-r), L(1+r)]; pdbench's inferencex one, [rL, L], is that window
    centred on L(1+r)/2 with r' = (1-r)/(1+r)."""
    if convention == "vllm":
        return ["--random-input-len", str(isl), "--random-output-len", str(osl), "--random-range-ratio", f"{ratio:g}"]
    r = (1 - ratio) / (1 + ratio)
    return [
        "--random-input-len",
        str(round(isl * (1 + ratio) / 2)),
        "--random-output-len",
        str(round(osl * (1 + ratio) / 2)),
        "--random-range-ratio",
        f"{r:.6g}",
    ]
