"""Progress of each batch: a rich progress bar on a terminal, a few plain log lines otherwise.

The load generator only increments counters (`loadgen.Progress`); a display task polls
them, so progress costs nothing per request. A batch that is stopping (a first Ctrl-C) says
so in its `note`: the bar's label then tells how many requests are still in flight.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Literal, TextIO

from harness.bench.loadgen import Progress

PLAIN_EVERY_S = 30.0  # a plain line at most this often while a batch runs
RICH_REFRESH_S = 0.2


def log(msg: str, stream: TextIO | None = None) -> None:
    print(f"[pdbench bench] {msg}", file=stream or sys.stderr, flush=True)


def pick_mode(mode: Literal["auto", "rich", "plain"], stream: TextIO | None = None) -> str:
    if mode != "auto":
        return mode
    stream = stream or sys.stderr
    return "rich" if getattr(stream, "isatty", lambda: False)() else "plain"


class Display:
    """Show one batch's progress until `close()`; use as an async context manager."""

    def __init__(self, label: str, progress: Progress, mode: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.progress = progress
        self.mode = mode
        self.stream = stream or sys.stderr
        self._task: asyncio.Task[None] | None = None
        self._bar: Any = None  # a rich Progress once started (rich is imported lazily)
        self._t0 = time.monotonic()

    async def __aenter__(self) -> Display:
        self._t0 = time.monotonic()
        if self.mode == "rich":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[failed]} failed"),
                TextColumn("{task.fields[rate]:.0f} req/s"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
                auto_refresh=False,
            )
            self._bar.start()
            self._rich_id = self._bar.add_task(self.label, total=self.progress.total, failed=0, rate=0.0)
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._update(final=True)
        if self._bar is not None:
            self._bar.stop()

    async def _poll(self) -> None:
        every = RICH_REFRESH_S if self.mode == "rich" else PLAIN_EVERY_S
        while True:
            await asyncio.sleep(every)
            self._update()

    def _describe(self, final: bool) -> str:
        p = self.progress
        if not p.note:
            return self.label
        return f"{self.label} {p.note}" if final else f"{self.label} {p.note}, {p.in_flight} in flight"

    def _update(self, final: bool = False) -> None:
        p = self.progress
        elapsed = time.monotonic() - self._t0
        rate = p.done / elapsed if elapsed > 0 else 0.0
        if self._bar is not None:
            self._bar.update(
                self._rich_id,
                description=self._describe(final),
                completed=p.done,
                total=p.total,
                failed=p.failed,
                rate=rate,
            )
            self._bar.refresh()
        elif not final:
            log(f"{self._describe(final)}: {p.done}/{p.total} done, {p.failed} failed, {elapsed:.0f} s", self.stream)
