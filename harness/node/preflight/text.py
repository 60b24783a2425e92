"""Helpers the checks share: numbers read from tool output, amounts and names written into problems."""

from __future__ import annotations

import os
from collections.abc import Sequence


def fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def uid() -> str:
    return f"uid {os.getuid()}"


def few(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def to_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def to_float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"
