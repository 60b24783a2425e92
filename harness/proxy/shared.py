"""What `pdbench proxy --workers N` processes share: legs in flight and open circuits.

The kernel spreads connections over the processes (SO_REUSEPORT), so each sees only its
share of the load. Each backend's legs in flight are kept in one anonymous shared mapping
made before the fork: a row per process, a column per backend. A process writes only its
own row (so no lock and no lost update) and the least-outstanding policy sums the column.
A circuit opened by one process (the time it opened; 0 = closed) is open for all, and a
health check that re-admits the backend in one process re-admits it everywhere.

Health polling stays per process: every process polls every backend, so their views
differ by at most one poll interval.
"""

from __future__ import annotations

import copy
import mmap
from typing import Any


class SharedState:
    """The mapping and this process's row in it."""

    def __init__(self, workers: int, backends: int) -> None:
        self.workers = workers
        self.backends = backends
        self._counts_map = mmap.mmap(-1, max(8 * workers * backends, 8))
        self._circuit_map = mmap.mmap(-1, max(8 * backends, 8))
        self.counts: Any = memoryview(self._counts_map).cast("q")  # [worker * backends + slot]
        self.circuit: Any = memoryview(self._circuit_map).cast("d")  # [slot]: open since (monotonic), 0 closed
        self.worker = 0

    def as_worker(self, worker: int) -> SharedState:
        """The same mapping seen as worker `worker` (0-based): each process takes its own."""
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} outside 0..{self.workers - 1}")
        view = copy.copy(self)
        view.worker = worker
        return view

    def columns(self, slot: int) -> tuple[int, tuple[int, ...]]:
        """(this process's cell, every process's cell) of backend `slot`."""
        if not 0 <= slot < self.backends:
            raise ValueError(f"backend slot {slot} outside 0..{self.backends - 1}")
        cells = tuple(w * self.backends + slot for w in range(self.workers))
        return cells[self.worker], cells
