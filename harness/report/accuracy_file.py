"""One accuracy eval's summary (evals/<phase>-<when>/pdbench-accuracy.json), read through its one
definition (harness.rundir.accuracy_summary). A file not in that form raises AccuracyFileError
naming the key."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from harness.rundir.accuracy_summary import AccuracySummary


class AccuracyFileError(Exception):
    """The message says which key is wrong; the file is listed as skipped with it."""


def _where(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "the summary"


def read_accuracy(path: Path) -> AccuracySummary:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise AccuracyFileError(f"unreadable: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AccuracyFileError(f"not valid JSON ({e})") from None
    try:
        return AccuracySummary.model_validate(data)
    except ValidationError as e:
        raise AccuracyFileError(
            "; ".join(
                f"{_where(err['loc'])}: "
                + ("missing" if err["type"] == "missing" else f"{err['msg']} ({err['input']!r})")
                for err in e.errors()
            )
        ) from None
