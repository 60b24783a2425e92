"""Which result files a resumed sweep keeps, and where it puts the ones it runs again.

A result is never overwritten: a point that is run again has its earlier, incomplete
file moved to superseded/ first (numbered when that name is taken).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from harness.bench.results import BenchResult
from harness.rundir.paths import SUPERSEDED


def why_not_kept(path: Path, isl: int, osl: int, concurrency: int, num_prompts: int, model: str) -> str | None:
    """None when PATH holds a complete, valid result of this point; else why it must run again."""
    try:
        result = BenchResult.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as e:
        return f"unreadable ({type(e).__name__})"
    want = {
        "random_input_len": isl,
        "random_output_len": osl,
        "max_concurrency": concurrency,
        "num_prompts": num_prompts,
        "model_id": model,
    }
    if diff := [f"{k} {getattr(result, k)!r} (now {v!r})" for k, v in want.items() if getattr(result, k) != v]:
        return "made with other settings: " + ", ".join(diff)
    return incomplete(result)


def incomplete(result: BenchResult) -> str | None:
    """Why RESULT is not a finished, valid point; None when it is."""
    if result.stop_reason:
        return f"cut short: {result.stop_reason}"
    if result.failed or result.completed != result.num_prompts:
        return f"{result.failed} failed, {result.completed} of {result.num_prompts} completed"
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
