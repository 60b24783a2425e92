"""Which result files a resumed sweep keeps, and where it puts the ones it runs again.

A result is never overwritten: a point that is run again has its earlier, incomplete
file moved to superseded/ first (numbered when that name is taken).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.bench.results import BenchResult
from harness.bench.trace import TraceRecord, offsets
from harness.config.benchmark import BenchmarkSettings
from harness.rundir.paths import SUPERSEDED


@dataclass(frozen=True)
class TraceReplay:
    """What each point of a trace replay sends: the trace file, at a speed, its requests spread
    over span_s (None where the trace cannot be read: then the span is not checked)."""

    path: str
    speed: float
    span_s: float | None


def replay_of(cfg: BenchmarkSettings, records: Sequence[TraceRecord] | None) -> TraceReplay | None:
    """The replay CFG's points make (None: CFG is no trace replay). RECORDS: the requests each point
    replays, the trace's first trace.max_requests, as the sweep loads them; None when unreadable."""
    if cfg.trace is None or cfg.dataset_path is None:
        return None
    span = round(float(offsets(records, cfg.trace.speed)[-1]), 6) if records else None
    return TraceReplay(cfg.dataset_path, cfg.trace.speed, span)


def why_not_kept(
    path: Path,
    isl: int,
    osl: int,
    concurrency: int,
    num_prompts: int | None,
    model: str,
    trace: TraceReplay | None = None,
) -> str | None:
    """None when PATH holds a complete, valid result of this point; else why it must run again.
    A trace replay point (TRACE) must have replayed the same trace at the same speed; its request
    count is the trace's (None: the trace cannot be read here, the count is not checked)."""
    try:
        result = BenchResult.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as e:
        return f"unreadable ({type(e).__name__})"
    want: dict[str, Any] = {
        "random_input_len": isl,
        "random_output_len": osl,
        "max_concurrency": concurrency,
        "model_id": model,
    }
    if num_prompts is not None:
        want["num_prompts"] = num_prompts
    if trace is not None:
        want |= {"dataset_name": "mooncake_trace", "dataset_path": trace.path}
    diff = [f"{k} {getattr(result, k)!r} (now {v!r})" for k, v in want.items() if getattr(result, k) != v]
    if trace is not None:
        diff += _other_replay(result, trace)
    if diff:
        return "made with other settings: " + ", ".join(diff)
    return incomplete(result)


def _other_replay(result: BenchResult, trace: TraceReplay) -> list[str]:
    """How RESULT's replay (its `schedule` section) differs from TRACE's: speed, and the span of
    the trace's requests (another trace of as many requests has another span)."""
    schedule = (result.model_extra or {}).get("schedule")
    schedule = schedule if isinstance(schedule, dict) else {}
    speed, span = schedule.get("speed"), schedule.get("span_s")
    diff = []
    if speed != trace.speed:
        diff.append(f"trace speed {speed!r} (now {trace.speed!r})")
    if trace.span_s is not None and not (
        isinstance(span, int | float) and math.isclose(span, trace.span_s, rel_tol=1e-9, abs_tol=2e-6)
    ):
        diff.append(f"trace span {span!r} s (now {trace.span_s!r} s)")
    return diff


def incomplete(result: BenchResult) -> str | None:
    """Why RESULT is not a finished, valid point; None when it is."""
    if result.stop_reason:
        return f"cut short: {result.stop_reason}"
    if result.failed or result.completed != result.num_prompts:
        unsent = f", {result.not_sent} never sent" if result.not_sent else ""
        return f"{result.failed} failed{unsent}, {result.completed} of {result.num_prompts} completed"
    if result.metadata.get("valid") is False:
        return "judged invalid from the servers' metrics"
    return None


def set_aside(path: Path) -> Path:
    """Move PATH into superseded/ beside it without replacing anything there; returns the new path."""
    dest_dir = path.parent / SUPERSEDED
    dest_dir.mkdir(exist_ok=True)
    for n in range(1000):
        dest = dest_dir / (path.name if n == 0 else f"{path.stem}.{n}{path.suffix}")
        try:
            os.link(path, dest)  # fails if dest exists: nothing is replaced
        except FileExistsError:
            continue
        path.unlink()
        return dest
    raise FileExistsError(f"no free name for {path.name} in {dest_dir}")
