"""Profiles of a point's measured window (benchmark.profile, docs/profiling.md).

The profiled roles' servers were started with vLLM's profiler configured (harness.render.commands:
--profiler-config, and `nsys profile` around them for tool nsys). Around a window of requests,
`/start_profile` is called on each of them just before and `/stop_profile` just after; each server
writes its traces into its capture directory, and the window's new files are then moved to
`profiles/<point tag>/<instance>/` (harness.rundir.profile_summary).

Order, when perturbation is measured: the point's measured requests run unprofiled first (its
result, what InferenceX ingests), then a second window of the same size, rate and shape runs
profiled. Unprofiled first, so that nothing of the profiler (a trace being written, its memory)
can reach the result. Same distribution, not the same requests: the same prompts again would hit
the prefix cache and make the profiled TTFT incomparably short.

Every call is bounded; a failure (no profiler on the server: 404, a timeout, no trace written)
is recorded in words in the point's `profile` section and the log, never a lost point. A user's
stop (the sweep's first Ctrl-C) shortens the bound of a stop running or to come (`hurry`).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from harness.config.benchmark import ProfileSettings
from harness.rundir.profile_summary import ServerTraces, WindowFigures, capture_dir, point_dir

# A trace is complete when its file's size has not moved for this long after /stop_profile.
SETTLE_S = 0.5
POLL_S = 0.2
TRACE_SUFFIXES = {"torch": (".pt.trace.json", ".pt.trace.json.gz"), "nsys": (".nsys-rep",)}
# nsys's raw stream, which its importer turns into the .nsys-rep; an nsys without the importer
# (the one inside Nsight Compute) leaves it so (docs/profiling.md).
NSYS_STREAM = ".qdstrm"


@dataclass
class _Server:
    instance: str
    role: str
    url: str
    before: set[str] = field(default_factory=set)  # capture directory's files before the start
    started: bool = False
    error: str | None = None


def _files(directory: Path) -> dict[str, int]:
    """File name -> size of the capture directory's files (none yet: {})."""
    try:
        return {e.name: e.stat().st_size for e in os.scandir(directory) if e.is_file()}
    except FileNotFoundError:
        return {}


def window_figures(metrics: dict[str, Any]) -> WindowFigures:
    """The figures the profile compares, from compute_metrics' output."""
    return WindowFigures(
        completed=int(metrics["completed"]),
        failed=int(metrics.get("failed", 0)),
        output_throughput=float(metrics["output_throughput"]),
        median_ttft_ms=float(metrics["median_ttft_ms"]),
        median_tpot_ms=float(metrics.get("median_tpot_ms", 0.0)),
    )


def perturbation(profiled: WindowFigures, unprofiled: WindowFigures) -> dict[str, float | None]:
    """profiled / unprofiled per figure (None where the unprofiled one is 0)."""
    out: dict[str, float | None] = {}
    for key in ("output_throughput", "median_ttft_ms", "median_tpot_ms"):
        base = getattr(unprofiled, key)
        out[key] = round(getattr(profiled, key) / base, 4) if base else None
    return out


class PointProfiler:
    """Starts and stops the profiler of every server of the chosen roles around one window."""

    def __init__(
        self,
        settings: ProfileSettings,
        targets: list[tuple[str, str, str]],
        run_dir: Path,
        tag: str,
        log: Callable[[str], None],
    ) -> None:
        self.settings, self.run_dir, self.tag, self.log = settings, run_dir, tag, log
        self.servers = [_Server(name, role, url) for name, role, url in targets if role in settings.roles]
        self.deadline = math.inf  # monotonic time at which the running stop gives up
        # A user's stop: the stop is bounded by hurry_s instead of stop_timeout_s; `hurried` says why.
        self.hurry_s: float | None = None
        self.hurried: str | None = None

    def hurry(self, within_s: float, why: str) -> None:
        """Bound the stop to `within_s` from now if one is running, else from its start."""
        self.hurry_s, self.hurried = within_s, why
        self.deadline = min(self.deadline, time.monotonic() + within_s)

    def _bound(self) -> str:
        """The stop's bound, in words for an error."""
        if self.hurried is not None and self.hurry_s is not None and self.hurry_s < self.settings.stop_timeout_s:
            return f"{self.hurry_s:g} s ({self.hurried})"
        return f"stop_timeout_s={self.settings.stop_timeout_s:g}"

    def cut_short(self, traces: list[ServerTraces]) -> list[str]:
        """The section's word when a user's stop bounded the wait: which servers' traces came."""
        if self.hurried is None:
            return []
        came = [t.instance for t in traces if t.files]
        none = [t.instance for t in traces if not t.files]
        limit = self.settings.stop_timeout_s
        if self.hurry_s is not None and self.hurry_s < limit:
            waited = f"{self.hurry_s:g} s at most, not stop_timeout_s={limit:g}"
        else:
            waited = f"stop_timeout_s={limit:g} at most"
        return [
            f"{self.hurried}: traces waited for {waited}; traces came from {', '.join(came) or 'no server'}"
            + (f", none from {', '.join(none)}" if none else "")
        ]

    async def start(self) -> bool:
        """/start_profile on every server at once; a server that refuses keeps its error. Whether
        any server's profiler may be running (else a window would measure no profiler at all)."""
        for s in self.servers:
            s.before = set(_files(self.run_dir / capture_dir(s.instance)))
        body: dict[str, Any] = {"profile_prefix": self.tag}
        if self.settings.max_iterations is not None:
            body["max_iterations"] = self.settings.max_iterations
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._start(session, s, body) for s in self.servers))
        for s in self.servers:
            if s.error is not None:
                self.log(f"{self.tag}: profile: {s.instance}: {s.error}")
        return any(s.started for s in self.servers)

    def refused(self) -> list[ServerTraces]:
        """Every server's entry when none started: its error, no files."""
        return [ServerTraces(instance=s.instance, role=s.role, error=s.error) for s in self.servers]

    async def _start(self, session: aiohttp.ClientSession, s: _Server, body: dict[str, Any]) -> None:
        timeout = self.settings.start_timeout_s
        try:
            async with session.post(
                f"{s.url}/start_profile", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as r:
                text = (await r.text())[:300]
                if r.status == 404:
                    s.error = (
                        "/start_profile answered 404: the server was started without vLLM's profiler "
                        "(its role must be in benchmark.profile.roles when the job is rendered)"
                    )
                elif r.status != 200:
                    s.error = f"/start_profile answered {r.status}: {text}"
                else:
                    s.started = True
        except TimeoutError:
            s.error = f"/start_profile did not answer within start_timeout_s={timeout:g}"
            s.started = True  # it may have started all the same: stop it
        except aiohttp.ClientError as e:
            s.error = f"/start_profile failed: {type(e).__name__}: {e}"

    async def stop(self) -> list[ServerTraces]:
        """/stop_profile on every started server, then each one's new trace files moved to the
        point's directory; bounded by stop_timeout_s in all (by hurry's bound after a user's stop)."""
        self.deadline = time.monotonic() + min(self.settings.stop_timeout_s, self.hurry_s or math.inf)

        async def one(session: aiohttp.ClientSession, s: _Server) -> ServerTraces:
            # Each server's traces are collected as soon as its own stop answered, while a slower
            # server's stop runs: a bound that ends the wait finds the quick ones settled.
            if s.started:
                await self._stop(session, s)
            return await self._collect(s)

        async with aiohttp.ClientSession() as session:
            traces = await asyncio.gather(*(one(session, s) for s in self.servers))
        for t in traces:
            if t.error is not None:
                self.log(f"{self.tag}: profile: {t.instance}: {t.error}")
            else:
                self.log(
                    f"{self.tag}: profile: {t.instance}: {len(t.files)} file(s) in {point_dir(self.tag, t.instance)}"
                )
        return list(traces)

    async def _stop(self, session: aiohttp.ClientSession, s: _Server) -> None:
        # Polled against self.deadline rather than given a timeout: hurry may bring it nearer.
        call = asyncio.create_task(self._stop_call(session, s))
        while not call.done() and time.monotonic() < self.deadline:
            await asyncio.wait({call}, timeout=POLL_S)
        if call.done():
            call.result()  # raises what _stop_call does not answer for
            return
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        s.error = s.error or f"/stop_profile did not answer within {self._bound()}"

    async def _stop_call(self, session: aiohttp.ClientSession, s: _Server) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.stop_timeout_s)
        try:
            async with session.post(f"{s.url}/stop_profile", timeout=timeout) as r:
                if r.status != 200:
                    s.error = s.error or f"/stop_profile answered {r.status}: {(await r.text())[:300]}"
        except TimeoutError:
            s.error = s.error or f"/stop_profile did not answer within {self._bound()}"
        except aiohttp.ClientError as e:
            s.error = s.error or f"/stop_profile failed: {type(e).__name__}: {e}"

    async def _collect(self, s: _Server) -> ServerTraces:
        """Wait (bounded) until a trace file of the window is there and no new file's size moves
        for SETTLE_S, then move the window's files to the point's directory."""
        out = ServerTraces(instance=s.instance, role=s.role, error=s.error)
        if not s.started:
            return out
        source = self.run_dir / capture_dir(s.instance)
        suffixes = TRACE_SUFFIXES[self.settings.tool]
        seen: dict[str, int] = {}
        settled_at = time.monotonic()
        unconverted: list[str] = []  # nsys streams left without their report
        while True:
            now = {n: size for n, size in _files(source).items() if n not in s.before}
            if now != seen:
                seen, settled_at = now, time.monotonic()
            has_trace = any(n.endswith(suffixes) for n in seen)
            if has_trace and time.monotonic() - settled_at >= SETTLE_S:
                break
            if time.monotonic() >= self.deadline:
                settled = time.monotonic() - settled_at >= SETTLE_S
                # A settled stream may be one a full nsys is still converting (the files do not
                # tell): only at the bound is it taken for one that no importer converts.
                if self.settings.tool == "nsys" and not has_trace and settled:
                    unconverted = sorted(n for n in seen if n.endswith(NSYS_STREAM))
                if unconverted:
                    why = f"stream not converted: nsys left {', '.join(unconverted)} and no .nsys-rep"
                else:
                    why = "no trace file" if not has_trace else "trace files still growing"
                out.error = f"{why} in {capture_dir(s.instance)} within {self._bound()}" + (
                    f" ({s.error})" if s.error else ""
                )
                break
            await asyncio.sleep(POLL_S)
        where = point_dir(self.tag, s.instance)
        target = self.run_dir / where
        target.mkdir(parents=True, exist_ok=True)
        for name in sorted(seen):
            os.replace(source / name, target / name)
            out.files.append(f"{where}/{name}")
        if unconverted and out.error is not None:
            out.error += "; convert with Nsight Systems' importer: " + "; ".join(
                f"QdstrmImporter -i {where}/{n}" for n in unconverted
            )
        return out
