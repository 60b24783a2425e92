"""A profiled point's `profile` section, and where its traces live in the run directory.

A profiled server writes its traces into its capture directory (`profiles/.capture/<instance>`,
named in its --profiler-config or nsys -o when the job is rendered); after each profiled window
the sweep moves that window's new files to `profiles/<point tag>/<instance>/`
(harness.bench.profile). Paths in the section are relative to the run directory.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from harness.strict import Strict

PROFILES = "profiles"


def capture_dir(instance: str) -> str:
    """Where the server `instance` (e.g. decode-0) writes its traces, relative to the run directory."""
    return f"{PROFILES}/.capture/{instance}"


def point_dir(point_tag: str, instance: str) -> str:
    """Where one point's traces of `instance` are kept, relative to the run directory."""
    return f"{PROFILES}/{point_tag}/{instance}"


class WindowFigures(Strict):
    """The medians of one measured window (as the point's result states them)."""

    completed: int
    failed: int
    output_throughput: float  # tok/s
    median_ttft_ms: float
    median_tpot_ms: float


class ServerTraces(Strict):
    """One profiled server's traces of the window, or why there are none."""

    instance: str  # e.g. prefill-0
    role: str
    files: list[str] = Field(default_factory=list)  # relative to the run directory
    error: str | None = None


class ProfileSummary(Strict):
    tool: Literal["torch", "nsys"]
    # second: a window of its own after the unprofiled one (the point's result); measured: the
    # point's measured window itself was profiled (perturbation false).
    window: Literal["second", "measured"]
    # None when no window ran profiled (the measured one stopped, or no server's profiler started).
    profiled: WindowFigures | None
    unprofiled: WindowFigures | None = None  # the point's result; None when window is measured
    # profiled / unprofiled of each figure: 1.0 is no cost; throughput below 1 and TTFT or TPOT
    # above 1 are the profiler's. None when a figure is 0 or the window is the measured one.
    perturbation: dict[str, float | None] | None = None
    servers: list[ServerTraces]
    # The window's own trouble (not run, stopped early), in words; each server's is in its entry.
    errors: list[str] = Field(default_factory=list)
