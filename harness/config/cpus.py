"""VLLM_CPU_OMP_THREADS_BIND's syntax (a recipe's `cpu_bind`): one parser for the recipe check
and for the node that pins a server to its cores, so what validate accepts is what runs."""

from __future__ import annotations

import re

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_groups(spec: str) -> list[set[int]]:
    """'0-3|4-7' -> [{0..3}, {4..7}]: '|'-separated groups (one per rank) of ','-separated cores
    or ascending ranges. ValueError saying what is wrong (an empty group, 'a-b', '5-2')."""
    groups = []
    for group in spec.split("|"):
        cpus: set[int] = set()
        parts = [p.strip() for p in group.split(",")]
        if not any(parts):
            raise ValueError(f"an empty core group in {spec!r} (write e.g. '0-3' or '0-3|4-7')")
        for part in parts:
            m = _RANGE.fullmatch(part)
            if m is None:
                raise ValueError(f"{part!r} is not a core number or a range LOW-HIGH")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError(f"the range {part!r} runs backwards")
            cpus.update(range(lo, hi + 1))
        groups.append(cpus)
    return groups


def parse_cpus(spec: str) -> set[int]:
    """Every core of the spec, its groups together."""
    return set().union(*parse_groups(spec))
