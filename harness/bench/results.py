"""Result model, file naming, and write-once atomic file creation."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict


class ResultExistsError(FileExistsError):
    """A result file is already there; results are never overwritten."""


class BenchResult(BaseModel):
    """One concurrency point, keyed like `vllm bench serve --save-result` output.

    Every key of vLLM's saved result is here with its exact name (and the IX fork's
    `best_of`), plus pdbench's own: the range-ratio convention and dataset settings,
    `stop_reason`, and the per-request arrays vLLM keeps only with --save-detailed.
    The per-percentile keys (`p99_ttft_ms`, `p99.9_itl_ms`, ...) depend on the
    configured percentiles, so they are kept as validated-on-write extra fields.
    """

    model_config = ConfigDict(extra="allow")

    date: str
    endpoint_type: str = "openai"
    backend: str = "openai"
    label: str | None = None
    model_id: str
    tokenizer_id: str
    best_of: int = 1
    num_prompts: int
    request_rate: float | str  # "inf" when unlimited, as vLLM writes it
    burstiness: float = 1.0
    max_concurrency: int
    range_ratio: float
    range_ratio_convention: str
    random_input_len: int
    random_output_len: int
    random_prefix_len: int = 0
    dataset_name: str = "random"
    dataset_path: str | None = None
    goodput_slos_ms: dict[str, float] | None = None
    # Why the point ended before every request was done (point or total timeout,
    # target died); None for a complete point.
    stop_reason: str | None = None
    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None = None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    rtfx: float = 0.0  # audio only in vLLM; always 0 here
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    std_e2el_ms: float
    latencies: list[float] = []
    queue_times: list[float] = []
    start_times: list[float | None] = []  # s from the first send; None: never sent
    input_lens: list[int]
    output_lens: list[int]
    ttfts: list[float]
    itls: list[list[float]]
    errors: list[str]
    metadata: dict[str, Any] = {}


def rate_label(request_rate: float) -> str:
    if math.isinf(request_rate):
        return "inf"
    return str(int(request_rate)) if request_rate.is_integer() else str(request_rate)


def result_filename(concurrency: int, request_rate: float, prefill_gpus: int, decode_gpus: int) -> str:
    return (
        f"concurrency_{concurrency}_req_rate_{rate_label(request_rate)}"
        f"_gpus_{prefill_gpus + decode_gpus}_ctx_{prefill_gpus}_gen_{decode_gpus}.json"
    )


def write_result(result: BenchResult, path: Path) -> Path:
    """Create `path` with the result, atomically and only if it does not exist.

    Writes a temp file in the same directory, then hard-links it to the final name:
    readers never see a partial file, and os.link fails instead of replacing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "w") as f:
            f.write(result.model_dump_json(indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ResultExistsError(f"result file already exists, not overwriting: {path}") from None
    finally:
        os.unlink(tmp)
    return path
