"""Per-request timings of decode's KV loads: one JSON line per request that carries an id.

The proxy puts the client's X-Pdbench-Id into decode's ``kv_transfer_params`` (``pdbench_id``);
decode's TP rank 0 writes one line per such request once its first step ran, into
``<timings_dir>/connector-timings-<pid>.jsonl`` (setting ``timings_dir``; none: nothing is
recorded). pdbench's TTFT breakdown joins the lines with the proxy's records by ``id``.

Every duration (ms) is one process's monotonic clock (``time.perf_counter``): never a
difference of two processes' or two hosts' clocks. The scheduler's durations reach the
worker in the step's metadata.

    id             the request's X-Pdbench-Id
    req            vLLM's id of the request on decode
    queue_ms       scheduler: first asked for the request's remote tokens -> its blocks allocated
    load_ms        scheduler: blocks allocated -> the load reported finished (hand-off to the
                   worker, the pull, the report a step later at most)
    pull_ms        worker: pull request sent -> ack sent (connect, prefill's answer, the bytes);
                   inside load_ms. With several pulls (differing TP) the longest.
    pull_wait_ms   worker: pull request sent -> prefill's answer (inside pull_ms)
    ready_ms       scheduler: load reported finished -> the request's first step scheduled
    first_step_ms  worker: that step's metadata bound -> its forward returned (with CUDA, the
                   launches: kernels may still run)
    bytes, blocks  what the pull moved (this rank's shard), into how many blocks
    path           "ipc" (CUDA IPC, same host) or "tcp"
    early          decode had the request before prefill finished (the proxy's overlapped flow):
                   pull_wait_ms then includes waiting for prefill's compute
    ok             the pull succeeded (else the request recomputed its prompt)

Writing never blocks the engine: lines go through a bounded queue to a writer thread, which
flushes after each batch; when the queue is full a line is dropped and counted (logged at
shutdown).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

PREFIX = "connector-timings-"  # + <pid>.jsonl, beside the proxy's proxy-timings-<pid>.jsonl
QUEUE_LINES = 8192
_STOP = object()


class TimingsFile:
    """Appends JSON lines to this process's timings file from a writer thread."""

    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / f"{PREFIX}{os.getpid()}.jsonl"
        self.dropped = 0
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_LINES)
        self._thread = threading.Thread(target=self._run, name="pdbench-timings", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        """Queue one line; never waits (a full queue drops it)."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        out: IO[str] | None = None
        try:
            while True:
                batch = [self._queue.get()]
                while not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                stop = any(r is _STOP for r in batch)
                lines = [json.dumps(r, separators=(",", ":")) + "\n" for r in batch if r is not _STOP]
                if lines:
                    if out is None:
                        self.path.parent.mkdir(parents=True, exist_ok=True)
                        out = open(self.path, "a")  # noqa: SIM115  # open for the thread's life
                    out.writelines(lines)
                    out.flush()  # a point's lines are on disk as soon as its requests ran
                if stop:
                    return
        except OSError as exc:
            log.error("pdbench: cannot write KV timings to %s: %s; no more are recorded", self.path, exc)
        finally:
            if out is not None:
                out.close()

    def close(self, timeout: float = 5.0) -> None:
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if self.dropped:
            log.warning("pdbench: %d KV timing lines dropped (writer behind)", self.dropped)
