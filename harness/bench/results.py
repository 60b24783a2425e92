"""Result model, file naming, and write-once atomic file creation."""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness import atomic
from harness.rundir.bottleneck_summary import BottleneckSummary
from harness.rundir.profile_summary import ProfileSummary


class ResultExistsError(FileExistsError):
    """A result file is already there; results are never overwritten."""


class ResultDirUnwritable(Exception):
    """The result directory cannot take a file: found before any request is sent."""


# The probe written before any load: a page, so a full disk fails it as a read-only one does.
PROBE_BYTES = 4096
# Where a point's result goes when its own file cannot be written (a disk that filled mid-run).
SPARE_DIR = "pdbench-unwritten"


# A latency statistic (mean, median, std, a percentile of TTFT, TPOT, ITL or E2EL): over no
# completed request it is undefined, and the result leaves it out ("n/a"), where vLLM writes 0.
LATENCY_STAT = re.compile(r"(mean|median|std|p[\d.]+)_(ttft|tpot|itl|e2el)_ms")
NO_LATENCIES = "n/a: no measured request completed"


def _na() -> Any:
    """A latency statistic's field: absent from the file when undefined (no request completed)."""
    return Field(None, exclude_if=lambda v: v is None)


def check_writable(directory: Path) -> None:
    """Write, sync and remove a probe file in `directory`; raises ResultDirUnwritable naming the path
    and why (read-only, full, no permission). Directories it had to create for the probe are removed
    again: a sweep that then sends nothing leaves nothing behind (the first result creates them)."""
    directory = Path(directory)
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    probe = directory / f".pdbench-write-probe-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise ResultDirUnwritable(
            f"result_dir {directory} cannot take a result file ({e.strerror or e}: {e.filename or probe}); "
            "nothing was sent"
        ) from None
    finally:
        for path in (probe, *missing):  # deepest first
            try:
                path.rmdir() if path in missing else path.unlink()
            except OSError:
                pass


def write_spare(result: BenchResult, path: Path) -> Path:
    """Write the result of a point whose file `path` could not be written into a new file under the
    temporary directory ($TMPDIR/pdbench-unwritten/), named after it; raises OSError if that fails too."""
    spare = Path(tempfile.gettempdir()) / SPARE_DIR
    spare.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{path.stem}.", suffix=path.suffix, dir=spare)
    with os.fdopen(fd, "w") as f:
        f.write(result.model_dump_json(indent=2) + "\n")
    return Path(name)


class BenchResult(BaseModel):
    """One concurrency point, keyed like `vllm bench serve --save-result` output.

    Every key of vLLM's saved result is here with its exact name (and the IX fork's
    `best_of`, `benchmark_start_time_unix`/`_end_`), plus pdbench's own: the range-ratio
    convention and dataset settings, `goodput_slos`, `stop_reason`, and the per-request
    arrays vLLM keeps only with --save-detailed. The per-percentile keys (`p99_ttft_ms`,
    ...) depend on the configured percentiles, so they are extra fields, as are the TPOT
    keys (see below).

    InferenceX's ingestion (utils/process_result.py) reads every top-level key ending in
    "ms" as float(value) / 1000 and every key containing "tpot" as 1000 / float(value), so
    here such a key always holds a finite number, and a TPOT one a non-zero number (checked
    on creation; the error names the key). A TPOT statistic that is 0 (no request had two
    tokens, one sample's std, tokens in one burst) is where vLLM writes 0; pdbench moves it
    to `zero_per_token_stats` instead, keeping the value out of InferenceX's division. A point
    where no request completed has no latency statistic at all (vLLM writes 0s, which read as a
    fast point): they are left out and `latency_stats` says n/a.
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
    # The goodput SLOs as {"ttft_ms": 500.0, ...}; null without --goodput. (Not named
    # `goodput_slos_ms`: InferenceX converts every key ending in "ms" to a number.)
    goodput_slos: dict[str, float] | None = None
    # Why the point ended before every request was done (point or total timeout,
    # target died); None for a complete point.
    stop_reason: str | None = None
    duration: float
    # Wall-clock (epoch s) of the first send and the last end of the measured requests, so
    # end - start == duration (the IX fork's keys; InferenceX's power accounting reads them).
    benchmark_start_time_unix: float | None = None
    benchmark_end_time_unix: float | None = None
    completed: int
    failed: int  # sent and not successful
    # Never sent: a stop (Ctrl-C, a time limit, an early invalid verdict, a dead target) came first.
    # completed + failed + not_sent == num_prompts. Files written before it was counted have none.
    not_sent: int = 0
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None = None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    rtfx: float = 0.0  # audio only in vLLM; always 0 here
    # Absent (None here) when no request completed: `latency_stats` then says so.
    mean_ttft_ms: float | None = _na()
    median_ttft_ms: float | None = _na()
    std_ttft_ms: float | None = _na()
    mean_itl_ms: float | None = _na()
    median_itl_ms: float | None = _na()
    std_itl_ms: float | None = _na()
    mean_e2el_ms: float | None = _na()
    median_e2el_ms: float | None = _na()
    std_e2el_ms: float | None = _na()
    latency_stats: str | None = Field(None, exclude_if=lambda v: v is None)
    latencies: list[float] = []
    queue_times: list[float] = []
    start_times: list[float | None] = []  # s from the first send; None: never sent
    input_lens: list[int]
    output_lens: list[int]
    ttfts: list[float]
    itls: list[list[float]]
    errors: list[str]
    zero_per_token_stats: dict[str, float] = {}
    # What limits the point, with its evidence (harness.validity.bottleneck); checked on creation.
    bottleneck: BottleneckSummary | None = None
    # A profiled point's traces and the profiler's cost (harness.bench.profile); absent otherwise.
    profile: ProfileSummary | None = Field(None, exclude_if=lambda v: v is None)
    metadata: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _move_zero_tpot(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("completed") == 0:
            # No request completed: every latency statistic is n/a, not 0 (a 0.0 TTFT would read
            # as a fast point), and the file says so.
            kept = {k: v for k, v in data.items() if not LATENCY_STAT.fullmatch(k)}
            return kept | {"latency_stats": NO_LATENCIES}
        zero = {k: v for k, v in data.items() if "tpot" in k and isinstance(v, (int, float)) and v == 0}
        if not zero:
            return data
        kept = {k: v for k, v in data.items() if k not in zero}
        return kept | {"zero_per_token_stats": {**(data.get("zero_per_token_stats") or {}), **zero}}

    @model_validator(mode="after")
    def _inferencex_ingestible(self) -> BenchResult:
        for key in [*type(self).model_fields, *(self.model_extra or {})]:
            if not (key.endswith("ms") or "tpot" in key):
                continue
            value = getattr(self, key)
            if value is None and self.completed == 0 and LATENCY_STAT.fullmatch(key):
                continue  # n/a: left out of the file
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{key}: must be a finite number (InferenceX reads it as one), got {value!r}")
            if "tpot" in key and value == 0:
                raise ValueError(f"{key}: must not be 0 (InferenceX divides 1000 by it)")
        return self


def write_result(result: BenchResult, path: Path) -> Path:
    """Create `path` with the result, atomically and only if it does not exist."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return atomic.write_text(path, result.model_dump_json(indent=2) + "\n", replace=False)
    except FileExistsError:
        raise ResultExistsError(f"result file already exists, not overwriting: {path}") from None
