"""Keep a CPU-only vLLM instance on the cores the recipe gave it (`cpu_bind`).

vLLM binds only its workers' OpenMP threads. The API server, the EngineCore and every
other thread float over all cores, so one instance's front end (HTTP, tokenising,
scheduling) runs on the cores of another instance's forward pass: on a 2-core host this
alone put a 1P1D pair's TTFT at 1.27x a single instance's, against 1.03-1.08x with each
instance kept on its own core (benchmarks/README.md). And NixlConnector's worker moves its
main thread (the model forward) onto the last core of each NUMA node whatever
VLLM_CPU_OMP_THREADS_BIND says. After the server is healthy we therefore set every thread
of the server's process tree to its cores (what `taskset -a -p` does); threads started
later inherit it. With several groups (TP: one core group per worker, "0|1"), workers'
OpenMP threads keep vLLM's per-core binding and only their main threads are set.
"""

from __future__ import annotations

import logging
import os

import psutil

from harness.config.cpus import parse_cpus

log = logging.getLogger(__name__)


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


def pin_instance(server_pid: int, spec: str) -> list[int]:
    """Set the server's threads (see the module doc) to the cores of `spec`; returns the PIDs
    of the processes that were pinned."""
    cpus = parse_cpus(spec) & set(range(os.cpu_count() or 1))
    if not cpus:
        return []
    try:
        root = psutil.Process(server_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    per_core_workers = "|" in spec  # vLLM binds each worker's OpenMP threads to its own group
    workers = {p.pid for p in worker_processes(server_pid)}
    pinned = []
    for p in procs:
        try:
            tids = [p.pid] if p.pid in workers and per_core_workers else [t.id for t in p.threads()]
            for tid in tids:
                try:
                    os.sched_setaffinity(tid, cpus)
                except ProcessLookupError:  # a thread that just ended
                    continue
            pinned.append(p.pid)
        except (OSError, psutil.NoSuchProcess) as e:
            log.warning("could not pin pid %d: %s", p.pid, e)
    log.info("pinned server %d (%d processes) to cores %s", server_pid, len(pinned), sorted(cpus))
    return pinned
