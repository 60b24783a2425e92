"""A run's points: the ones its client configs plan, and what each one's result file says.

One place for the point-by-point view that `submit` prints at its end, `--resume` prints
before it starts and `pdbench status` counts (valid/total). A sweep that another client than
pdbench's measures (benchmark.client aiperf or vllm, the job's or a workload's) plans no result
file: its points are that client's directories (other_client_sweeps).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from harness.bench.client_config import ClientConfig
from harness.bench.results import BenchResult
from harness.bench.resume import TraceReplay, incomplete, replay_of
from harness.bench.trace import TraceError, TraceRecord, load_trace
from harness.config.load import _validation_error
from harness.rundir import ResultName, RunDir
from harness.rundir.paths import bench_config_name, client_point_subdir, workload_bench_config_name, workload_subdir
from harness.topology import PlanFile

PHASES = ("disagg", "aggregated")


@dataclass(frozen=True)
class Point:
    """One planned point of a run, and its result when the run has one."""

    phase: str
    concurrency: int
    shape: str | None  # isl/osl, in a several-shape sweep
    path: Path
    isl: int
    osl: int
    num_prompts: int | None  # None: a trace replay whose trace cannot be read here
    model: str
    trace: TraceReplay | None = None  # what a trace replay point replays
    result: BenchResult | None = None
    problem: str | None = None  # why the result is not a complete, valid point (None: it is)
    workload: str | None = None  # a workload's point (benchmark.workloads), under workloads/<name>/

    @property
    def label(self) -> str:
        text = f"C={self.concurrency}" + (f" {self.shape}" if self.shape else "")
        text += f" [workload {self.workload}]" if self.workload else ""
        return text + (" (aggregated)" if self.phase == "aggregated" else "")

    @property
    def valid(self) -> bool:
        return self.result is not None and self.problem is None

    @property
    def verdict(self) -> str:
        """yes, unverified (no server metrics judged it), or what is wrong with it."""
        if self.result is None:
            return self.problem or "no result"
        if self.problem is not None:
            return self.problem
        return "unverified" if self.result.metadata.get("valid") is None else "yes"


class PointsUnknown(Exception):
    """The run's client config cannot be read: the points it plans are unknown."""


def _config(path: Path) -> ClientConfig:
    try:
        return ClientConfig.model_validate(json.loads(path.read_text()))
    except ValidationError as e:  # (a ValueError too) the loader's reading: the whole key, what is wrong
        err = _validation_error(ClientConfig, path, e)
        raise PointsUnknown(f"{path}: not a readable client config ({err.key}: {err.expected})") from None
    except (OSError, ValueError) as e:
        raise PointsUnknown(f"{path}: not a readable client config ({e})") from None


def _read(path: Path) -> tuple[BenchResult | None, str | None]:
    if not path.is_file():
        return None, "no result"
    try:
        result = BenchResult.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError):
        return None, "unreadable result file"
    return result, incomplete(result)


def _trace(cfg: ClientConfig) -> list[TraceRecord] | None:
    """The requests each point of a trace replay sends, as the sweep loads them (the trace's first
    trace.max_requests); None when the trace cannot be read here (it is read where the job runs)."""
    assert cfg.trace is not None and cfg.dataset_path is not None
    try:
        return load_trace(cfg.dataset_path)[: cfg.trace.max_requests]
    except TraceError:
        return None


def _searched(run: RunDir, cfg: ClientConfig) -> set[int] | None:
    """With an SLO search over the ladder, the concurrencies its record says it measured (the
    others were never needed, not missing); None for a plain sweep or a search not yet begun."""
    if cfg.slo_search is None or not run.slo_search.is_file():
        return None
    try:
        steps = json.loads(run.slo_search.read_text()).get("steps", [])
        return {int(s["concurrency"]) for s in steps}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # an unreadable record: every ladder point is shown, none hidden


def _workloads(run: RunDir) -> list[str]:
    """The run's workloads in recipe order, as its plan (PlanFile) lists them; none when the plan
    is missing or unreadable (its points are then the phases' alone)."""
    try:
        return list(PlanFile.model_validate_json(run.plan.read_text()).workloads)
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return []


def _client_configs(run: RunDir) -> list[tuple[str, ClientConfig, Path, str | None]]:
    """Each client config of the run in the order the job runs them, with its phase and where its
    results go: the phases' at the top, then each workload's (phase, config, folder, workload)."""
    clients: list[tuple[str, Path, Path, str | None]] = [
        (phase, run.path / bench_config_name(phase), run.path, None) for phase in PHASES
    ]
    clients += [
        ("disagg", run.path / workload_bench_config_name(w), run.path / workload_subdir(w), w) for w in _workloads(run)
    ]
    return [(phase, _config(path), where, workload) for phase, path, where, workload in clients if path.is_file()]


@dataclass(frozen=True)
class OtherClientSweep:
    """A sweep whose numbers another client than pdbench's measured (benchmark.client)."""

    client: str
    concurrency: list[int]
    where: RunDir  # the folder its `pdbench bench` wrote into: the run's, or a workload's
    phase: str
    workload: str | None  # a workload's sweep (benchmark.workloads); None: the phase's own

    @property
    def written(self) -> int:
        """How many of its points have a directory (begun or finished)."""
        found = self.where.client_points(self.client, self.phase)
        return sum(c in found for c in self.concurrency)

    @property
    def line(self) -> str:
        what = f"workload {self.workload}" if self.workload else "the sweep"
        what += " (aggregated)" if self.phase == "aggregated" else ""
        points = self.where.path / client_point_subdir(self.client, "<C>", self.phase)
        return f"{self.client} measured {what}, {self.written} of {len(self.concurrency)} point(s) written, under {points}/"


def other_client_sweeps(run: RunDir) -> list[OtherClientSweep]:
    """The run's sweeps that another client measured, in the order the job runs them."""
    return [
        OtherClientSweep(cfg.client, cfg.concurrency, RunDir(where / cfg.result_dir), phase, workload)
        for phase, cfg, where, workload in _client_configs(run)
        if cfg.client != "pdbench"
    ]


def planned(run: RunDir, with_results: bool = True) -> list[Point]:
    """Every point of pdbench's own that the run's client configs plan, in the order the client runs
    them. A ladder point that the run's SLO search skipped is not planned, unless it has a result file."""
    points = []
    for phase, cfg, where, workload in _client_configs(run):
        if cfg.client != "pdbench":  # its points are the other client's directories, not result files
            continue
        searched = _searched(run, cfg)
        records = _trace(cfg) if cfg.trace is not None else None
        trace = replay_of(cfg, records)
        for shape in cfg.shape_list():
            tag = shape.tag if cfg.multi_shape else None
            for c in cfg.concurrency:
                name = ResultName(c, cfg.request_rate, tag, cfg.prefill_gpus, cfg.decode_gpus, cfg.gpus).filename
                file = Path(cfg.result_dir) / name
                file = file if file.is_absolute() else where / file
                if searched is not None and c not in searched and not file.is_file():
                    continue
                result, problem = _read(file) if with_results else (None, None)
                shown = f"{shape.isl}/{shape.osl}" if cfg.multi_shape else None
                if trace is None:
                    n: int | None = cfg.num_prompts_for(c)
                else:  # a trace replay point sends the trace's requests, whatever its concurrency
                    n = len(records) if records is not None else None
                points.append(
                    Point(phase, c, shown, file, shape.isl, shape.osl, n, cfg.model, trace, result, problem, workload)
                )
    return points
