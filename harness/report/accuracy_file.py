"""One accuracy eval's summary (evals/<phase>-<when>/pdbench-accuracy.json) -> AccuracySummary.
A file not in that form raises AccuracyFileError naming the key."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness.report.points import AccuracySummary, AccuracyTask

PHASES = ("disagg", "aggregated")
WHENS = ("before", "after")


class AccuracyFileError(Exception):
    """The message says which key is wrong; the file is listed as skipped with it."""


def _number(v: Any, key: str, nullable: bool = True) -> float | None:
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise AccuracyFileError(f"{key} is not a finite number{' or null' if nullable else ''} ({v!r})")
    return float(v)


def _int(v: Any, key: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise AccuracyFileError(f"{key} is not a non-negative integer or null ({v!r})")
    return v


def _flag(v: Any, key: str) -> bool | None:
    if v is not None and not isinstance(v, bool):
        raise AccuracyFileError(f"{key} is not true, false or null ({v!r})")
    return v


def _text(v: Any, key: str) -> str:
    if not isinstance(v, str):
        raise AccuracyFileError(f"{key} is not text ({v!r})")
    return v


def _task(t: Any, i: int) -> AccuracyTask:
    where = f"tasks[{i}]"
    if not isinstance(t, dict):
        raise AccuracyFileError(f"{where} is not an object")
    return AccuracyTask(
        task=_text(t.get("task"), f"{where}.task"),
        metric=_text(t.get("metric"), f"{where}.metric"),
        score=_number(t.get("score"), f"{where}.score"),
        stderr=_number(t.get("stderr"), f"{where}.stderr"),
        threshold=_number(t.get("threshold"), f"{where}.threshold"),
        passed=_flag(t.get("passed"), f"{where}.passed"),
        samples=_int(t.get("samples"), f"{where}.samples"),
    )


def read_accuracy(path: Path) -> AccuracySummary:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise AccuracyFileError(f"unreadable: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AccuracyFileError(f"not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise AccuracyFileError(f"not an accuracy summary: the JSON is {type(data).__name__}, not an object")
    phase, when = data.get("phase"), data.get("when")
    if phase not in PHASES:
        raise AccuracyFileError(f"phase is not one of {', '.join(PHASES)} ({phase!r})")
    if when not in WHENS:
        raise AccuracyFileError(f"when is not one of {', '.join(WHENS)} ({when!r})")
    conc = _int(data.get("concurrency"), "concurrency")
    if conc is None:
        raise AccuracyFileError("concurrency is missing")
    tasks = data.get("tasks")
    if not isinstance(tasks, list):
        raise AccuracyFileError(f"tasks is not a list ({tasks!r})")
    error = data.get("error")
    return AccuracySummary(
        path=path,
        phase=phase,
        when=when,
        concurrency=conc,
        lm_eval_version=_text(data.get("lm_eval_version"), "lm_eval_version"),
        base_url=_text(data.get("base_url"), "base_url"),
        elapsed_s=_number(data.get("elapsed_s"), "elapsed_s", nullable=False) or 0.0,
        tasks=tuple(_task(t, i) for i, t in enumerate(tasks)),
        passed=_flag(data.get("passed"), "passed"),
        error=None if error is None else _text(error, "error"),
    )
