"""How a busy GPU is named in a problem, for every vendor's check."""

from __future__ import annotations

# A process holding GPU memory: (pid or None when not reported, name or "", MiB or None when not reported).
Holder = tuple[int | None, str, float | None]

BUSY_HINT = "(an orphaned container or another job?); stop it, or have the node drained, before the run"


def busy_text(holders: list[Holder]) -> str:
    parts = []
    for pid, name, mib in holders:
        who = f"pid {pid}" + (f" ({name})" if name else "") if pid is not None else (name or "a process")
        parts.append(
            f"{who} holds {mib:.0f} MiB" if mib is not None else f"{who} holds GPU memory (amount not reported)"
        )
    return ", ".join(parts)
