"""Keep a CPU-only vLLM worker's model thread on the cores the recipe gave it.

NixlConnector's worker calls sched_setaffinity on its main thread, moving the model
forward of every instance onto the last core of each NUMA node whatever
VLLM_CPU_OMP_THREADS_BIND says; with several instances on one host they then share a
core. After the server is healthy we set the main thread of each `VLLM::Worker`
process back to the bound cores (what `taskset -p` does; other threads are untouched).
"""

from __future__ import annotations

import logging
import os

import psutil

log = logging.getLogger(__name__)


def parse_cpus(spec: str) -> set[int]:
    """'0', '0-3', '0,2,4-5' -> set of core ids (VLLM_CPU_OMP_THREADS_BIND syntax, one NUMA group)."""
    cpus: set[int] = set()
    for part in spec.replace("|", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return cpus


def worker_processes(server_pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for p in children:
        try:
            if "VLLM::Worker" in p.name() or "VLLM::Worker" in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def pin_worker_main_threads(server_pid: int, spec: str) -> list[int]:
    """Returns the PIDs whose main thread was (re)pinned."""
    cpus = parse_cpus(spec) & set(range(os.cpu_count() or 1))
    if not cpus:
        return []
    pinned = []
    for p in worker_processes(server_pid):
        try:
            if os.sched_getaffinity(p.pid) != cpus:
                os.sched_setaffinity(p.pid, cpus)
                log.info("pinned main thread of %s (pid %d) to cores %s", p.name(), p.pid, sorted(cpus))
            pinned.append(p.pid)
        except (OSError, psutil.NoSuchProcess) as e:
            log.warning("could not pin pid %d: %s", p.pid, e)
    return pinned
