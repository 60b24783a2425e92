"""Run directories of `pdbench submit` in a results tree, and a finished point written into one."""

from __future__ import annotations

import json
from pathlib import Path

from harness.rundir import RunDir


def recipe_runs(results: Path, recipe: str) -> list[RunDir]:
    return [RunDir(p) for p in sorted((results / recipe).iterdir())] if (results / recipe).is_dir() else []


def finished_point(run: RunDir, concurrency: int) -> None:
    """A complete, valid result of the run's point, made with the run's own client settings."""
    from harness.rundir import ResultName
    from helpers.bench_results import bench_result

    cfg = json.loads(run.bench_config().read_text())
    n = max(cfg["min_prompts"], cfg["prompts_multiplier"] * concurrency)
    result = bench_result(
        max_concurrency=concurrency,
        num_prompts=n,
        completed=n,
        model_id=cfg["model"],
        random_input_len=cfg["isl"],
        random_output_len=cfg["osl"],
        metadata={"valid": True},
    )
    name = ResultName(concurrency, float("inf"), prefill_gpus=cfg["prefill_gpus"], decode_gpus=cfg["decode_gpus"])
    (run.path / name.filename).write_text(result.model_dump_json())
