"""The sweep's points in order, each with its result file, and which of them a resumed sweep keeps
(harness.bench.resume judges a file; the ones run again are set aside first)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.bench.client_config import ClientConfig
from harness.bench.progress import log
from harness.bench.results import ResultExistsError
from harness.bench.resume import set_aside, why_not_kept
from harness.bench.workloads import Workload
from harness.config.benchmark import Shape
from harness.rundir import ResultName
from harness.rundir.paths import REPEATS, SLO_SEARCH


@dataclass(frozen=True)
class Point:
    shape: Shape
    concurrency: int
    path: Path
    kept: bool = False  # resumed: complete in an earlier run, not run again


class PointPlan:
    def __init__(self, base: ClientConfig, workload: Workload) -> None:
        self.base = base
        self.workload = workload

    def points(self) -> list[Point]:
        """Every (shape, concurrency) point with its file; with resume, the complete ones are
        kept and the others' files set aside. Raises ResultExistsError without resume."""
        base = self.base
        result_dir = Path(base.result_dir)
        points = []
        for shape in base.shape_list():
            tag = shape.tag if base.multi_shape else None
            for c in base.concurrency:
                name = ResultName(c, base.request_rate, tag, base.prefill_gpus, base.decode_gpus, base.gpus).filename
                points.append(Point(shape, c, result_dir / name))
        existing = [p for p in points if p.path.exists()]
        # An SLO search's record and repeats are results too. On resume the record is rebuilt (its
        # kept points count as measured), the earlier one set aside; a repeat is kept if complete.
        search = [result_dir / SLO_SEARCH, result_dir / REPEATS] if base.slo_search is not None else []
        records = [p for p in search if p.exists()]
        if (existing or records) and not base.resume:
            paths = ", ".join(str(p) for p in [*(p.path for p in existing), *records])
            raise ResultExistsError(f"result files already exist, not overwriting: {paths}")
        if base.resume and (record := result_dir / SLO_SEARCH) in records:
            log(f"resume: the SLO search starts again from the points kept; {record.name} was {set_aside(record)}")
        kept = {p.path for p in existing if self.keeps(p.path, p.shape, p.concurrency)}
        if base.resume and base.slo_search is not None:
            log(
                f"resume: {len(kept)} of {len(points)} ladder point(s) already done; the SLO search counts them measured"
            )
        elif base.resume:
            log(f"resume: {len(kept)} of {len(points)} point(s) already done, {len(points) - len(kept)} to run")
        return [Point(p.shape, p.concurrency, p.path, p.path in kept) for p in points]

    def keeps(self, path: Path, shape: Shape, concurrency: int) -> bool:
        """Resume: whether PATH holds this point complete; if not, it is set aside to be run again."""
        why = why_not_kept(
            path,
            shape.isl,
            shape.osl,
            concurrency,
            self.workload.requests(self.base, concurrency),
            self.base.model,
            trace=self.workload.replay(self.base),
        )
        if why is None:
            return True
        moved = set_aside(path)
        log(f"resume: {path.name} is run again ({why}); the earlier file is now {moved}")
        return False
