"""A sweep of the aggregated mock engine, whose timing its config sets: one request at a time
(max_num_seqs 1), TTFT then ITL per further token. The predictor's tests measure against it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness import tiny_model
from harness.bench import ClientConfig, run_sweep_detailed
from helpers.mock_engine import Engine

TTFT_MS, ITL_MS, ISL, OSL = 40.0, 5.0, 16, 8
SERVICE_MS = TTFT_MS + (OSL - 1) * ITL_MS
ENGINE = (1, 8192)  # the mock's max_num_seqs, and a batch-token limit it never reaches


def mock_sweep(tmp: Path, run: Path, concurrency: Sequence[int], num_prompts: int = 24) -> Path:
    """The mock measured at each concurrency; `run`, the result directory, is returned."""
    model = str(tiny_model.build(tmp / "m"))
    with Engine(model="tiny", ttft_ms=TTFT_MS, itl_ms=ITL_MS, max_num_seqs=1) as engine:
        cfg = ClientConfig(
            base_url=engine.url,
            model="tiny",
            tokenizer=model,
            isl=ISL,
            osl=OSL,
            concurrency=list(concurrency),
            num_prompts=num_prompts,
            num_warmups=0,
            result_dir=str(run),
            gpus=1,
            health_check_interval_s=0,
        )
        outcomes = run_sweep_detailed(cfg)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    return run
