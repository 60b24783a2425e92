"""pdbench's verdict of one eval (pdbench-accuracy.json), read from lm-eval's results file.

The format is what `pdbench report` reads; every key is always present:
{"phase", "when", "concurrency", "lm_eval_version", "base_url", "elapsed_s",
 "tasks": [{"task", "metric", "score", "stderr", "threshold", "passed", "samples"}],
 "passed", "error"}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.atomic import write_json
from harness.config.accuracy import AccuracyTask


@dataclass(frozen=True)
class TaskScore:
    task: str
    metric: str
    score: float | None
    stderr: float | None
    threshold: float | None
    passed: bool | None
    samples: int | None


def verdict(score: float | None, threshold: float | None) -> bool | None:
    """None without a threshold; a missing score fails a threshold."""
    if threshold is None:
        return None
    return score is not None and score >= threshold


def stderr_key(metric: str) -> str:
    """lm-eval's stderr key of a metric key: 'exact_match,strict-match' -> 'exact_match_stderr,strict-match'."""
    name, sep, filt = metric.partition(",")
    return f"{name}_stderr{sep}{filt}"


def _number(v: Any) -> float | None:
    # lm-eval writes "N/A" for a stderr it could not compute (one sample).
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def score_task(task: AccuracyTask, results: dict[str, Any] | None) -> TaskScore:
    """One task's score from lm-eval's results JSON (None: it wrote none)."""
    row = ((results or {}).get("results") or {}).get(task.name) or {}
    score = _number(row.get(task.metric))
    samples = ((results or {}).get("n-samples") or {}).get(task.name, {}).get("effective")
    return TaskScore(
        task=task.name,
        metric=task.metric,
        score=score,
        stderr=_number(row.get(stderr_key(task.metric))),
        threshold=task.threshold,
        passed=verdict(score, task.threshold),
        samples=samples if isinstance(samples, int) else None,
    )


@dataclass(frozen=True)
class Summary:
    phase: str
    when: str
    concurrency: int
    lm_eval_version: str
    base_url: str
    elapsed_s: float
    tasks: list[TaskScore]
    error: str | None

    @property
    def passed(self) -> bool | None:
        """False on an error or a task under its threshold; None when nothing was judged."""
        if self.error is not None or any(t.passed is False for t in self.tasks):
            return False
        return True if any(t.passed for t in self.tasks) else None

    def failures(self) -> list[str]:
        """Why the eval fails the job, one line per task (or the error)."""
        out = [
            f"accuracy {self.phase} {self.when}: task {t.task} scored {_fmt(t.score)} ({t.metric}), "
            f"under its threshold {t.threshold}"
            for t in self.tasks
            if t.passed is False
        ]
        if self.error is not None:
            out.append(f"accuracy {self.phase} {self.when}: {self.error}")
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["elapsed_s"] = round(self.elapsed_s, 3)
        return {
            k: d[k] for k in ("phase", "when", "concurrency", "lm_eval_version", "base_url", "elapsed_s", "tasks")
        } | {
            "passed": self.passed,
            "error": self.error,
        }

    def write(self, path: Path) -> Path:
        return write_json(path, self.to_json(), indent=2, replace=False)


def _fmt(score: float | None) -> str:
    return "nothing" if score is None else f"{score:.4f}"
