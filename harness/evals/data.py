"""Is each task's data there before the eval needs it? Offline clusters read the HF cache only."""

from __future__ import annotations

import os
from pathlib import Path

from harness.config.accuracy import AccuracySpec
from harness.evals.interpreter import LmEvalUnavailable, task_datasets, version


def offline(env: dict[str, str]) -> bool:
    return any(env.get(k, "").lower() in ("1", "true", "yes") for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def _cached(dataset: str, env: dict[str, str]) -> bool:
    home = Path(env.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    hub = Path(env.get("HF_HUB_CACHE") or home / "hub")
    datasets_cache = Path(env.get("HF_DATASETS_CACHE") or home / "datasets")
    return (hub / f"datasets--{dataset.replace('/', '--')}").is_dir() or any(
        datasets_cache.glob(f"{dataset.replace('/', '___')}*")
    )


def missing_data(spec: AccuracySpec, env: dict[str, str] | None = None) -> list[str]:
    """lm-eval itself missing from accuracy.python; tasks from its registry whose Hugging Face
    dataset is not cached, when offline. Both are asked of accuracy.python, never imported here.

    Online, lm-eval downloads what it needs; tasks with include_path are checked by
    harness.config.accuracy.problems.
    """
    env = dict(os.environ) if env is None else env
    if not spec.enabled:
        return []
    todo = [t for t in spec.tasks if t.include_path is None]
    try:
        version(spec, env)
        if not todo or not offline(env):
            return []
        datasets = task_datasets(spec, [t.name for t in todo], env)
    except LmEvalUnavailable as e:
        return [str(e)]
    out = []
    for t in todo:
        if t.name not in datasets:
            out.append(f"accuracy task {t.name!r}: lm-eval has no such task")
            continue
        dataset = datasets[t.name]
        if dataset and dataset != "json" and not _cached(dataset, env):
            out.append(
                f"accuracy task {t.name!r}: its dataset {dataset!r} is not in the Hugging Face cache "
                "(HF_HUB_CACHE / HF_DATASETS_CACHE) and this job is offline"
            )
    return out
