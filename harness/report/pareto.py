"""The Pareto front of points where higher is better on both axes (the plot and the decision)."""

from __future__ import annotations

import math


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes (higher x and higher y are better), by x."""
    pts = sorted({p for p in points if all(math.isfinite(v) for v in p)}, key=lambda p: (-p[0], -p[1]))
    front: list[tuple[float, float]] = []
    best_y = -math.inf
    for x, y in pts:  # from the highest x down: keep a point when its y beats all at higher x
        if y > best_y:
            front.append((x, y))
            best_y = y
    return sorted(front)
