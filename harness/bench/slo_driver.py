"""An SLO search as a driver over points (benchmark.slo_search): the points the ladder asks for
(harness.bench.slo_ladder), then each SLO's best again until its goodput's confidence interval
is narrow enough; every measurement judged for every SLO and recorded in slo_search.json after
each step (harness.bench.slo_record). The search is one shape (the config refuses several)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.bench.client_config import ClientConfig
from harness.bench.point_runner import PointOutcome, PointRunner
from harness.bench.points import Point, PointPlan
from harness.bench.progress import log
from harness.bench.results import BenchResult
from harness.bench.scope import Scope
from harness.bench.slo_ladder import Ladder, repeats_stop
from harness.bench.slo_record import SearchRecord, Verdict, goodput_per_device, judge
from harness.bench.stops import Stops
from harness.bench.sweep_sentinels import SweepSentinels
from harness.rundir.paths import SLO_SEARCH, repeat_subdir


class SloDriver:
    def __init__(
        self, base: ClientConfig, stops: Stops, runner: PointRunner, plan: PointPlan, sentinels: SweepSentinels
    ) -> None:
        self.base = base
        self.stops = stops
        self.runner = runner
        self.plan = plan
        self.sentinels = sentinels

    async def run(self, points: list[Point]) -> list[PointOutcome]:
        base = self.base
        search = base.slo_search
        assert search is not None
        by_c = {pt.concurrency: pt for pt in points}
        scope = Scope.of_shape(base, points[0].shape)
        ladder = Ladder(base.concurrency, list(search.slos), base.search_start)
        record = SearchRecord(Path(base.result_dir) / SLO_SEARCH, base.concurrency, search.slos, base.search_start)
        record.write()
        outcomes: list[PointOutcome] = []
        goodput: dict[int, float | None] = {}  # first measurements' goodput per device
        while (step := ladder.next()) is not None:
            pt = by_c[step.concurrency]
            outcome, verdicts, gpd = await self._measure(scope, pt, step.why, 0, record, len(outcomes))
            outcomes.append(outcome)
            if (why := self.stops.stopped()) is not None:
                return self._stopped(outcomes, why)
            ladder.record(step.concurrency, {n: v.meets for n, v in verdicts.items()})
            goodput[step.concurrency] = gpd
        brackets = {name: ladder.bracket(name) for name in search.slos}
        record.brackets(brackets)
        for name, b in brackets.items():
            log(f"SLO search: {name}: best C={b.best}, first failing C={b.first_failing}")
        for c in dict.fromkeys(b.best for b in brackets.values() if b.best is not None):
            samples = [g for g in [goodput[c]] if g is not None]
            k = 0
            rule = search.repeats
            while (stop := repeats_stop(samples, k, rule.max, rule.ci_half_width, rule.confidence)) is None:
                k += 1
                outcome, _, gpd = await self._measure(scope, by_c[c], "repeat", k, record, len(outcomes))
                outcomes.append(outcome)
                if (why := self.stops.stopped()) is not None:
                    record.repeats(c, samples, search.repeats.confidence, None)
                    return self._stopped(outcomes, why)
                if gpd is not None:
                    samples.append(gpd)
                record.repeats(c, samples, search.repeats.confidence, None)
            record.repeats(c, samples, search.repeats.confidence, stop)
            log(f"SLO search: C={c}: {k} repeat(s), stopped: {stop}")
        record.done()
        for c in base.concurrency:
            if c not in ladder.meets:
                above = c > max(ladder.meets)
                log(f"C={c}: not run: the SLO search {'stopped below it' if above else 'did not need it'}")
        return outcomes

    def _stopped(self, outcomes: list[PointOutcome], why: str) -> list[PointOutcome]:
        """The search ended before its end: slo_search.json keeps done false."""
        log(f"SLO search: stopped before its end ({why}); the points left are not run")
        return outcomes

    async def _measure(
        self, scope: Scope, pt: Point, why: str, repeat: int, record: SearchRecord, index: int
    ) -> tuple[PointOutcome, dict[str, Verdict], float | None]:
        """One measurement of the search (repeat 0: the point's first, at the top of the run
        directory; k: under repeats/<k>/ with its own evidence), judged for every SLO and recorded."""
        search, c = self.base.slo_search, pt.concurrency
        assert search is not None
        path = pt.path if repeat == 0 else Path(self.base.result_dir) / repeat_subdir(repeat) / pt.path.name
        judged: dict[str, Any] = {}

        def annotate(result: BenchResult) -> None:
            data = result.model_dump(mode="json")
            judged["result"] = data
            verdicts = judge(search.slos, data)
            result.metadata["slo_search"] = {
                "repeat": repeat,
                "slos": {n: {"meets": v.meets, "violations": v.violations} for n, v in verdicts.items()},
            }

        if pt.kept if repeat == 0 else path.exists() and self.plan.keeps(path, pt.shape, c):
            outcome = self.runner.kept(scope, Point(pt.shape, c, path, True))
            judged["result"] = json.loads(path.read_text())
        else:
            log(f"C={c}: SLO search: {why}" + (f" {repeat}" if repeat else ""))
            if repeat == 0:
                outcome = await self.runner.run(scope, index, c, path, annotate)
            else:
                # A repeat's metrics and sentinels go under repeats/<k>/, its sentinel prompts its
                # own (their reference answered first).
                again = scope.for_repeat(self.base, repeat)
                await self.sentinels.for_repeat(again, c)
                outcome = await self.runner.run(again, index, c, path, annotate)
        result = judged.get("result") if outcome.path is not None else None
        verdicts = judge(search.slos, result)
        if result is not None or self.stops.stopped() is None:  # a point the stop kept from running is no step
            file = str(path.relative_to(Path(self.base.result_dir))) if result is not None else None
            record.step(c, repeat, why, file, result, verdicts)
        return outcome, verdicts, goodput_per_device(result) if result is not None else None
