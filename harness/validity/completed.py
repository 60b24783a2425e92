"""A point where no measured request completed is invalid, whatever its other evidence (or its
lack of any): it measured nothing, and its latencies are n/a."""

from __future__ import annotations

from harness.validity.rules import PointValidity, RuleResult

RULE = "requests_completed"


def with_completed(verdict: PointValidity, completed: int, requests: int, first_error: str | None) -> PointValidity:
    """The point's verdict with the rule `requests_completed` added; none completed makes it invalid
    (its reason after those of a verdict already invalid, which say why: e.g. the point was stopped
    early), one or more leaves the verdict as it was."""
    if completed > 0:
        return verdict
    why = f": {first_error}" if first_error else ""
    r = RuleResult(
        name=RULE,
        status="failed",
        measured=0,
        threshold=1,
        detail=f"none of the {requests} measured requests completed{why}",
    )
    return verdict.model_copy(
        update={
            "verdict": "invalid",
            "valid": False,
            "reasons": [*(verdict.reasons if verdict.verdict == "invalid" else []), f"{r.name}: {r.detail}"],
            "rules": [*verdict.rules, r],
        }
    )
