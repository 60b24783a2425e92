"""Host memory for the servers: MemAvailable, and the headroom under the job's cgroup limit."""

from __future__ import annotations

import re
from pathlib import Path

from harness.node.preflight.cgroup import cgroup_headroom
from harness.node.preflight.text import fmt_bytes


def check_memory(
    need_bytes: int,
    meminfo: Path = Path("/proc/meminfo"),
    *,
    cgroup_root: Path | None = Path("/sys/fs/cgroup"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
) -> list[str]:
    """At least `need_bytes` of host memory available: MemAvailable, and the job's cgroup
    memory limit (Slurm's --mem), which the kernel enforces with the OOM killer."""
    if need_bytes <= 0:
        return []
    problems: list[str] = []
    try:
        m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", meminfo.read_text(), re.MULTILINE)
    except OSError as e:
        return [f"cannot read {meminfo} ({e.strerror or e}) to check the {fmt_bytes(need_bytes)} the servers need"]
    if m is None:
        problems.append(f"no MemAvailable in {meminfo}; cannot check the {fmt_bytes(need_bytes)} the servers need")
    elif int(m.group(1)) * 1024 < need_bytes:
        problems.append(
            f"only {fmt_bytes(int(m.group(1)) * 1024)} of host memory is available (MemAvailable), the servers "
            f"on this node need {fmt_bytes(need_bytes)}; stop leftover processes on the node or lower the "
            "servers' CPU memory (e.g. VLLM_CPU_KVCACHE_SPACE)"
        )
    if cgroup_root is not None:
        found = cgroup_headroom(cgroup_root, proc_cgroup)
        if found is not None and found[0] < need_bytes:
            room, limit, used, where = found
            problems.append(
                f"this job's memory limit leaves {fmt_bytes(max(room, 0))} (cgroup {where}: limit "
                f"{fmt_bytes(limit)}, {fmt_bytes(used)} in use), the servers on this node need "
                f"{fmt_bytes(need_bytes)} and would be OOM-killed; ask Slurm for more memory (--mem, or --mem=0 "
                "for the whole node's) or lower the servers' CPU memory"
            )
    return problems
