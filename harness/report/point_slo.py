"""Why one point does not meet latency bounds, in words: the one judgement of a report Point
that the search (a candidate's best point) and the report's truth table share. A point meets
when no bound is violated, its verdict is not invalid, no request failed and it was not cut short."""

from __future__ import annotations

from collections.abc import Mapping

from harness.config.slo import violations
from harness.report.points import Point


def failures(point: Point, bounds: Mapping[str, float]) -> list[str]:
    """Why the point does not meet the bounds, in words; empty when it meets them (no bounds:
    only an invalid, failed or cut-short point fails)."""
    out = violations(bounds, point.ms)
    if point.verdict == "invalid":
        out.append("invalid: " + ("; ".join(point.validity_reasons) or "no reason recorded"))
    if point.failed:
        out.append(f"{point.failed} failed request{'' if point.failed == 1 else 's'}")
    if point.stop_reason:
        out.append(f"cut short: {point.stop_reason}")  # not measured to its end: no evidence it meets
    return out
