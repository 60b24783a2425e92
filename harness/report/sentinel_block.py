"""A result's `sentinels` block -> SentinelCheck: the point's sentinel prompts and how many of
their answers matched the reference path's. A block that is not in the bench client's form
raises ValueError naming the field."""

from __future__ import annotations

from typing import Any

from harness.report.points import SentinelCheck

COUNTS = ("sent", "answered", "exact", "matched")


def _count(block: dict[str, Any], key: str, field: str) -> int | None:
    v = block.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{field}.{key} is not a non-negative integer or null ({v!r})")
    return v


def parse_sentinels(block: Any) -> SentinelCheck:
    if not isinstance(block, dict):
        raise ValueError(f"sentinels is not an object ({type(block).__name__})")
    missing = [k for k in (*COUNTS, "reference", "match_rate", "first_divergence", "tolerance") if k not in block]
    if missing:
        raise ValueError(f"sentinels lacks {', '.join(missing)}")
    counts: dict[str, int] = {}
    for key in COUNTS:
        n = _count(block, key, "sentinels")
        if n is None:
            raise ValueError(f"sentinels.{key} is null; a count is needed")
        counts[key] = n
    if not counts["matched"] <= counts["answered"] <= counts["sent"] or counts["exact"] > counts["answered"]:
        raise ValueError(
            f"sentinels counts do not add up: sent {counts['sent']}, answered {counts['answered']}, "
            f"exact {counts['exact']}, matched {counts['matched']}"
        )
    rate = block["match_rate"]
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1):
        raise ValueError(f"sentinels.match_rate is not a number in [0, 1] or null ({rate!r})")
    divergence = block["first_divergence"]
    if not isinstance(divergence, list) or any(
        d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 0) for d in divergence
    ):
        raise ValueError(f"sentinels.first_divergence is not a list of token positions or nulls ({divergence!r})")
    tolerance = block["tolerance"]
    if not isinstance(tolerance, dict):
        raise ValueError(f"sentinels.tolerance is not an object ({tolerance!r})")
    reference, record = block["reference"], block.get("record")
    if not isinstance(reference, str):
        raise ValueError(f"sentinels.reference is not text ({reference!r})")
    if record is not None and not isinstance(record, str):
        raise ValueError(f"sentinels.record is not a path or null ({record!r})")
    return SentinelCheck(
        reference=reference,
        sent=counts["sent"],
        answered=counts["answered"],
        exact=counts["exact"],
        matched=counts["matched"],
        match_rate=None if rate is None else float(rate),
        first_divergence=tuple(divergence),
        match_tokens=_count(tolerance, "match_tokens", "sentinels.tolerance"),
        max_diverged=_count(tolerance, "max_diverged", "sentinels.tolerance"),
        record=record,
    )
