"""The memory left under this process's cgroup limits (v1 and v2): what Slurm's --mem enforces."""

from __future__ import annotations

from pathlib import Path

from harness.node.preflight.text import to_int

_UNLIMITED = 1 << 62  # cgroup v1 reports "no limit" as a huge page-rounded number


def cgroup_headroom(cgroup_root: Path, proc_cgroup: Path) -> tuple[int, int, int, Path] | None:
    """(headroom, limit, usage, cgroup dir) of the tightest memory limit over this process's
    cgroup and its ancestors (v2 and v1), or None when there is no limit. Reclaimable page
    cache (inactive_file) does not count as used."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    best: tuple[int, int, int, Path] | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":
            root = cgroup_root if (cgroup_root / "cgroup.controllers").exists() else cgroup_root / "unified"
            files = ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            root = cgroup_root / "memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        leaf = root / rel.lstrip("/")
        d = leaf if leaf.is_dir() else root  # inside a container the cgroup is often mounted at the root
        for found in _limits_up_to(root, d, *files):
            if best is None or found[0] < best[0]:
                best = found
    return best


def _limits_up_to(
    root: Path, d: Path, limit_f: str, usage_f: str, inactive_key: str
) -> list[tuple[int, int, int, Path]]:
    """(headroom, limit, used, dir) of every limited cgroup from `d` up to `root`."""
    found: list[tuple[int, int, int, Path]] = []
    while True:
        limit = _read_int(d / limit_f)
        usage = _read_int(d / usage_f)
        if limit is not None and limit < _UNLIMITED and usage is not None:
            used = max(0, usage - _inactive_file(d / "memory.stat", inactive_key))
            found.append((limit - used, limit, used, d))
        if d == root or d == d.parent:
            return found
        d = d.parent


def _read_int(p: Path) -> int | None:
    try:
        text = p.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else to_int(text)


def _inactive_file(stat_file: Path, key: str) -> int:
    try:
        for line in stat_file.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
