"""`pdbench search`: a search's candidates run as jobs within its budget, resumed, reported.

Order: the disaggregated candidates, fewest devices first, then grid order (a small candidate's
limit bounds the bigger ones, so pruning has its evidence early); before each launch the pruning
rule (harness.search.prune) and the budget decide, and every decision is printed with its reason.
Jobs are launched as `pdbench submit` does (a new run directory under runs/<candidate>/) while
the nodes in flight stay within budget.nodes_in_flight; a foreground launcher (the local one)
runs one job at a time to its end. Then the aggregated baseline at each SLO winner's device
count, then the report.

Prediction (harness.search.foresee, `predict:` in the search file): once a disaggregated
candidate is measured, its run's profile predicts every candidate still planned before it is
considered; they are measured in order of predicted objective, and after the throughput bound a
second rule prunes a candidate whose optimistic prediction cannot beat the best measured one.
Each candidate's prediction is kept in state.json and beside its run (prediction.json).

Resume: the same search in the same directory keeps done, skipped and excluded candidates,
re-attaches to a job still running and runs failed or cancelled ones again in a new run
directory (the old one kept). A job cancelled from outside the search stops further launches;
SIGINT or SIGTERM of the search cancels the jobs in flight.
"""

from __future__ import annotations

import math
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import exit_codes
from harness.config.cluster import chosen_profile
from harness.config.load import ConfigError, ResolvedRecipe
from harness.invocation import prog
from harness.launch.find import NoJob, job_of
from harness.launch.job import END_WAIT_S, Job, JobInfo, JobState, LaunchError, nap, recorded_end
from harness.launch.launcher import Launcher
from harness.predict.answer import PredictError, profiles_of
from harness.rundir import RunDir, prior_prediction, read_status
from harness.rundir.perf_profile import PerfProfile
from harness.search import foresee, space
from harness.search.decide import choose_all
from harness.search.outcome import EXCLUDED, CandidateOutcome, ReportEntry, read_outcome
from harness.search.prune import Decision, next_decision
from harness.search.report import write_report
from harness.search.search_dir import FINAL, CandidateState, SearchDir, SearchDirError, Status
from harness.search.space import Candidate, Choice
from harness.search.spec import LoadedSearch, load_search
from harness.submit.check import check_flags, check_storage, launcher_for, load, planned
from harness.submit.follow import FOLLOW_SLACK_S, STATUS_SETTLE_S, say
from harness.submit.pipeline import mark_not_submitted, render_run
from harness.submit.refused import Refused

SEARCHES = "searches"  # results/searches/<name>/: a search's directory by default
POLL_S = 10.0  # between polls of the jobs in flight (sbatch's scheduler is asked each time)
CANCEL_WAIT_S = 120.0  # for cancelled jobs to end, when the search is stopped


def default_search_dir(results_dir: Path, name: str) -> Path:
    return results_dir / SEARCHES / name


def prepare(
    ref: str,
    *,
    search_dir: Path | None,
    results_dir: Path,
    launcher_kind: str,
    cluster: str | None,
    overrides: Sequence[str] = (),
    skip_flag_check: bool = False,
    from_run: Path | None = None,
) -> Search:
    """The search REF (a name in searches/ or a path) loaded and its directory begun (or checked,
    when resuming); Refused for a search that cannot start. Its run() runs it, see there."""
    try:
        loaded = load_search(ref)
    except ConfigError as e:
        raise Refused(str(e)) from None
    # --set and --cluster become part of the search as run: a resume must give the same.
    spec = loaded.spec.model_copy(
        update={"set": [*loaded.spec.set, *overrides], "cluster": chosen_profile(loaded.cluster(cluster))}
    )
    loaded = LoadedSearch(loaded.name, loaded.path, spec)
    sdir = SearchDir(search_dir or default_search_dir(results_dir, loaded.name))
    definition = {"name": loaded.name, "file": str(loaded.path), "launcher": launcher_kind, "spec": spec.to_json()}
    profile = None
    if from_run is not None:  # it decides what is pruned: part of the search as run
        definition["from"] = str(from_run.resolve())
        profile = given_profile(from_run)
    try:
        resuming = sdir.begin(definition)
    except SearchDirError as e:
        raise Refused(str(e)) from None
    say(f"search {loaded.name}: {'resuming in' if resuming else 'directory'} {sdir.path}")
    resume = resume_command(ref, sdir.path, launcher_kind, cluster, overrides, from_run)
    s = Search(loaded, sdir, launcher_kind, resume, skip_flag_check=skip_flag_check)
    s.profile = profile
    return s


def given_profile(run: Path) -> tuple[str, PerfProfile]:
    """`--from RUN`'s disaggregated profile (fitted, stored in the run); Refused naming the run."""
    try:
        found = [p for p in profiles_of(run) if p.phase == "disagg"]
    except (PredictError, ValueError) as e:
        raise Refused(f"--from {run}: {e}") from None
    if not found:
        raise Refused(f"--from {run}: no disaggregated points to profile (the search predicts xP+yD)")
    return str(run.resolve()), found[0]


def _started(run: RunDir) -> bool:
    """Whether a node of the run's job left a record (nodes/, state/); one cancelled while queued left none."""
    return any(d.is_dir() and any(d.iterdir()) for d in (run.nodes, run.state))


def resume_command(
    ref: str,
    search_dir: Path,
    launcher_kind: str,
    cluster: str | None,
    overrides: Sequence[str],
    from_run: Path | None = None,
) -> str:
    words = ["search", ref, "--search-dir", str(search_dir), "--launcher", launcher_kind]
    if cluster is not None:
        words += ["--cluster", cluster]
    if from_run is not None:
        words += ["--from", str(from_run)]
    for o in overrides:
        words += ["--set", o]
    return f"{prog()} {shlex.join(words)}"


@dataclass
class Flight:
    """A job in flight and its time limit, counted from when it is first seen running."""

    name: str
    job: Job
    limit_s: float
    running_since: float | None = None
    recorded_end: float | None = None  # when its run directory was first seen to record its end


class Search:
    def __init__(
        self, loaded: LoadedSearch, sdir: SearchDir, launcher_kind: str, resume: str, *, skip_flag_check: bool = False
    ):
        self.loaded = loaded
        self.spec = loaded.spec
        self.sdir = sdir
        self.launcher_kind = launcher_kind
        self.resume = resume
        self.in_flight: dict[str, Flight] = {}
        self.stop_reason: str | None = None  # launch nothing more (a job was cancelled from outside)
        self.interrupted: int | None = None  # the signal that stopped the search
        self.foreground = False  # a foreground job runs now: a signal must reach its launcher
        self.skip_flag_check = skip_flag_check
        self.make_launcher: Callable[[str, ResolvedRecipe], Launcher] = launcher_for
        self.poll_s = POLL_S
        self.margin_s = float(FOLLOW_SLACK_S)  # past the job's own time limit: teardown, the launcher's polls
        self.profile: tuple[str, PerfProfile] | None = None  # (its run, relative), once one is fitted
        self.no_profile: dict[str, str] = {}  # run -> why no profile came of it

    @property
    def slos(self) -> dict[str, dict[str, float]]:
        return self.spec.slos

    # --- the plan -------------------------------------------------------------------------

    def run(self) -> int:
        """Run (or resume) the search; the exit code: 0 when every candidate ended as planned, 1
        when one failed or was cancelled (resume to retry it), 130 when it was interrupted."""
        try:
            with self.sdir.locked():
                return self._run()
        except SearchDirError as e:
            raise Refused(str(e)) from None

    def _run(self) -> int:
        self.sdir.states = self.sdir.read_state()  # as the last process left them
        choices = space.candidates(self.loaded, cluster=self.spec.cluster, launcher_kind=self.launcher_kind)
        self.merge(choices)
        with self._signals():
            try:
                self.reattach()
                grid = [c.candidate.name for c in choices]
                order = sorted(
                    (s for s in self.sdir.states.values() if s.candidate.kind == "disagg" and s.status == "planned"),
                    key=lambda s: (s.candidate.devices, grid.index(s.name) if s.name in grid else len(grid)),
                )
                self.run_all(self.check_flags_first([s.name for s in order]))
                if self.spec.baseline.aggregated and self.stop_reason is None and self.interrupted is None:
                    self.run_all(self.plan_baselines())
            except _Interrupted:
                pass
            if self.interrupted is not None:
                self.cancel_in_flight(f"the search was stopped by {signal.Signals(self.interrupted).name}")
        self.report()
        return self.exit_code()

    def merge(self, choices: Sequence[Choice]) -> None:
        """The grid's candidates into the state: new ones planned (or excluded); a resume keeps
        what ended, and plans failed and cancelled ones again (their runs kept)."""
        now = time.time()
        for choice in choices:
            old = self.sdir.states.get(choice.candidate.name)
            if old is None or old.candidate.overrides != choice.candidate.overrides:
                if choice.excluded is not None:
                    state = CandidateState(choice.candidate, "excluded", choice.excluded, planned_at=now)
                    say(f"{choice.candidate.name}: excluded: {choice.excluded}")
                else:
                    state = CandidateState(choice.candidate, "planned", planned_at=now)
                self.sdir.put(state)
            elif old.status in ("failed", "cancelled"):
                self.sdir.put(self.again(old))
        for old in list(self.sdir.states.values()):
            if old.candidate.kind == "agg" and old.status in ("failed", "cancelled"):
                self.sdir.put(self.again(old))

    def again(self, old: CandidateState) -> CandidateState:
        say(f"{old.name}: runs again (it {old.status}: {old.reason}); {old.run} kept")
        return CandidateState(
            old.candidate,
            "planned",
            f"runs again: it {old.status} ({old.reason})",
            planned_at=time.time(),
            earlier_runs=(*old.earlier_runs, *([old.run] if old.run else [])),
            earlier_outcomes=(*old.earlier_outcomes, *([old.outcome] if old.outcome else [])),
            forecast=old.forecast,
        )

    def check_flags_first(self, names: Sequence[str]) -> list[str]:
        """Every planned candidate's `vllm serve` lines through vLLM's parser before the first
        launch (one vLLM import for all): a flag vLLM rejects fails its candidate at once, not
        after the jobs before it, and a pruned candidate's lines are checked too (its recipe
        submitted by hand later finds them in the check's cache). The names that passed."""
        if self.skip_flag_check:
            return list(names)
        passed = []
        for name in names:
            state = self.sdir.states[name]
            try:
                rr = load(self.spec.recipe, list(state.candidate.overrides), self.spec.cluster)
                check_flags(planned(rr, self.make_launcher(self.launcher_kind, rr)), skip=False)
            except Refused as e:
                self.end(state, "failed", f"not launched: {e}")
                continue
            passed.append(name)
        return passed

    def reattach(self) -> None:
        """Jobs that a previous search process left running: followed again, not launched again."""
        for state in list(self.sdir.states.values()):
            if state.status != "running":
                continue
            run = self.sdir.run_path(state)
            try:
                if run is None:
                    raise NoJob("no run directory was recorded")
                job = job_of(RunDir(run))
            except LaunchError as e:
                self.sdir.put(self.again(state.update(status="failed", reason=f"its job cannot be found ({e})")))
                continue
            say(f"{state.name}: re-attached to {job.title}")
            self.in_flight[state.name] = Flight(state.name, job, self._limit_s(state.candidate))

    def plan_baselines(self) -> list[str]:
        """One aggregated baseline per distinct device count among the SLO winners."""
        picks = [c.winner for c in choose_all(self.entries(), self.slos).values() if c.winner is not None]
        found = [self.sdir.states[p.name].candidate for p in picks]
        names = []
        for winner in space.device_counts(found):
            choice = space.baseline(self.loaded, winner, cluster=self.spec.cluster, launcher_kind=self.launcher_kind)
            name = choice.candidate.name
            old = self.sdir.states.get(name)
            if old is not None and old.status != "planned":
                continue  # measured already (or excluded) in an earlier session
            if choice.excluded is not None:
                self.sdir.put(CandidateState(choice.candidate, "excluded", choice.excluded, planned_at=time.time()))
                say(f"{name}: excluded: {choice.excluded}")
                continue
            if old is None:
                self.sdir.put(CandidateState(choice.candidate, "planned", planned_at=time.time()))
            # else planned again by merge() after a failure: its earlier runs and their cost stay
            names.append(name)
        return names

    # --- running ---------------------------------------------------------------------------

    def run_all(self, names: Sequence[str]) -> None:
        queue = self.by_prediction(list(names))
        while queue or self.in_flight:
            while queue and self.stop_reason is None and self.interrupted is None:
                c = self.sdir.states[queue[0]].candidate
                if self.in_flight and self.nodes_in_flight() + c.nodes > self._node_budget():
                    break  # wait for a job to end
                queue.pop(0)
                self.consider(c)
                queue = self.by_prediction(queue)
            if self.stop_reason is not None or self.interrupted is not None:
                for name in queue:
                    why = self.stop_reason or "the search was interrupted"
                    say(f"{name}: not launched: {why}")
                queue.clear()
            if self.in_flight:
                self.poll()

    def consider(self, c: Candidate) -> None:
        """Launch the candidate, or skip it with the reason (pruning, by bound or by prediction; budget)."""
        decision, rule = self.decide(c), "throughput-bound"
        f = self.forecast(c)
        if decision.run and f is not None:
            why = foresee.prunes(f, self.finished(), self.slos, self.spec.predict)
            if why is not None:
                decision, rule = Decision(False, why), foresee.RULE
            else:
                decision = Decision(True, decision.reason + "; " + _predicted(f, self.slos))
        if decision.run:
            over = self.budget(c)
            decision, rule = (over, "budget") if over else (decision, rule)
        if not decision.run:
            self.sdir.put(self.sdir.states[c.name].update(status="skipped", reason=decision.reason, pruned_by=rule))
            say(f"{c.name}: skipped: {decision.reason}")
            return
        self.launch(c, decision.reason)

    # --- prediction --------------------------------------------------------------------------

    def by_prediction(self, queue: list[str]) -> list[str]:
        """The planned disaggregated candidates in order of predicted objective (highest first),
        those without a prediction first as they were; the others (baselines) after, as they were."""
        if self.spec.predict == "off":
            return queue
        disagg = [n for n in queue if self.sdir.states[n].candidate.kind == "disagg"]
        rest = [n for n in queue if n not in disagg]
        found = {n: self.forecast(self.sdir.states[n].candidate) for n in disagg}
        ordered = sorted(disagg, key=lambda n: -(f.objective if (f := found[n]) else math.inf))
        if ordered != disagg:
            say("order by prediction: " + ", ".join(ordered))
        return ordered + rest

    def forecast(self, c: Candidate) -> foresee.Forecast | None:
        """The candidate's prediction, made once (kept in state.json: a resume keeps it), from the
        profile of the first disaggregated candidate measured; None while there is none."""
        if self.spec.predict == "off" or c.kind != "disagg":
            return None
        state = self.sdir.states[c.name]
        if state.forecast is not None:
            return foresee.Forecast.from_json(state.forecast)
        profile = self.source_profile()
        if profile is None:
            return None
        source, prof = profile
        try:
            rr = load(self.spec.recipe, list(c.overrides), self.spec.cluster)
            f = foresee.forecast(c, rr, prof, source, self.slos, self.spec.concurrency)
        except (Refused, PredictError, ValueError) as e:
            say(f"{c.name}: no prediction: {e}")
            return None
        self.sdir.put(state.update(forecast=f.to_json()))
        return f

    def source_profile(self) -> tuple[str, PerfProfile] | None:
        """`--from RUN`'s profile, else that of the first finished candidate whose run gives one."""
        if self.profile is not None:
            return self.profile
        for s in self.sdir.states.values():
            run = self.sdir.run_path(s)
            if s.status != "done" or s.candidate.kind != "disagg" or run is None or s.run in self.no_profile:
                continue
            try:
                found = [p for p in profiles_of(run) if p.phase == "disagg"]
            except (PredictError, ValueError) as e:
                found, why = [], str(e)
            else:
                why = "no disaggregated points"
            if found:
                self.profile = (s.run or str(run), found[0])
                say(f"prediction: profile of {s.run} ({s.name})")
                return self.profile
            self.no_profile[s.run or str(run)] = why
            say(f"prediction: no profile from {s.run}: {why}")
        return None

    def decide(self, c: Candidate) -> Decision:
        if not self.spec.prune.enabled:
            return Decision(True, "pruning is off")
        return next_decision(c, self.finished(), self.slos, self.spec.prune.slack)

    def budget(self, c: Candidate) -> Decision | None:
        """A skip when launching C would pass the budget (max_jobs, device_hours, nodes_in_flight)."""
        b = self.spec.budget
        if b.nodes_in_flight is not None and c.nodes > b.nodes_in_flight:
            return Decision(False, f"needs {c.nodes} nodes > budget.nodes_in_flight {b.nodes_in_flight}")
        jobs = self.jobs_launched()
        if b.max_jobs is not None and jobs >= b.max_jobs:
            return Decision(False, f"budget.max_jobs {b.max_jobs} reached ({jobs} jobs launched)")
        if b.device_hours is not None:
            spent = self.device_hours_spent()
            wall = self.mean_wall_s()
            if wall is None:
                if spent >= b.device_hours:
                    return Decision(False, f"budget.device_hours {b.device_hours:g} spent ({spent:.3f})")
            else:
                flying = sum(self.sdir.states[n].candidate.devices for n in self.in_flight) * wall / 3600
                mine = c.devices * wall / 3600
                if spent + flying + mine > b.device_hours:
                    return Decision(
                        False,
                        f"budget.device_hours {b.device_hours:g}: spent {spent:.3f} + in flight {flying:.3f} + "
                        f"this job's estimate {mine:.3f} ({c.devices} devices x {wall:.0f} s, the mean job) would pass it",
                    )
        return None

    def launch(self, c: Candidate, why: str) -> None:
        state = self.sdir.states[c.name]
        try:
            rr = load(self.spec.recipe, list(c.overrides), self.spec.cluster)
            launcher = self.make_launcher(self.launcher_kind, rr)
            p = planned(rr, launcher)
            check_flags(p, self.skip_flag_check)
            check_storage(p)
            run = RunDir.create(self.sdir.results_dir(c.name), rr.name)
            render_run(p, run)
            if state.forecast is not None:  # beside the run: the report sets it against what it measures
                prior = foresee.prior(
                    foresee.Forecast.from_json(state.forecast), rr, f"pdbench search {self.loaded.name}"
                )
                prior_prediction.write(run.prior_prediction, prior)
        except Refused as e:
            self.end(state, "failed", f"not launched: {e}")
            return
        state = self.sdir.put(
            state.update(status="running", reason=why, run=self.sdir.relative(run.path), started_at=time.time())
        )
        say(f"{c.name}: launching ({why}) in {run.path}")
        try:
            self.foreground = launcher.foreground
            job = launcher.launch(run, p.plan.num_nodes)
        except LaunchError as e:
            if not run.launched:
                mark_not_submitted(run, str(e))
            self.end(state, "failed", f"launch failed: {e}")
            return
        except KeyboardInterrupt:  # the signal came before or after the launcher's own handling
            raise _Interrupted from None
        finally:
            self.foreground = False
        state = self.sdir.put(state.update(job_id=job.job_id))
        if launcher.foreground:  # it ran to its end here
            info = job.info()
            # The local launcher takes SIGTERM itself while its job runs: a SIGTERM that was not
            # `pdbench cancel` (which records the job cancelled) was meant for the search.
            if info.returncode == 128 + signal.SIGTERM and info.state is not JobState.CANCELLED:
                self.interrupted = signal.SIGTERM
            self.finish(Flight(c.name, job, rr.recipe.timeouts.job_s + self.margin_s), info)
            if self.interrupted is not None:
                raise _Interrupted
            return
        say(f"{c.name}: submitted {job.title}")
        self.in_flight[c.name] = Flight(c.name, job, rr.recipe.timeouts.job_s + self.margin_s)

    def poll(self) -> None:
        """One look at every job in flight; waits (bounded) when none ended."""
        ended = False
        for flight in list(self.in_flight.values()):
            try:
                info = flight.job.info()
            except LaunchError as e:
                say(f"{flight.name}: cannot ask {flight.job.title} ({e}); asking again")
                continue
            now = time.monotonic()
            if info.state is JobState.RUNNING and flight.running_since is None:
                flight.running_since = now
                say(f"{flight.name}: {flight.job.title} running")
            if info.state.finished or info.state is JobState.UNKNOWN:
                self.finish(flight, info)
                ended = True
            elif flight.running_since is not None and now - flight.running_since > flight.limit_s:
                self.overtime(flight, info)
                ended = True
        if not ended:
            self.nap()

    def nap(self) -> None:
        """Until the next poll: poll_s, or sooner once a job in flight has recorded its end in its
        run directory, so the next candidate need not wait out poll_s behind Slurm's teardown.
        The launcher stays the authority on the job's end: the next poll asks it."""
        nap(self.poll_s, self._ending, self.sleep)

    def _ending(self) -> bool:
        """Whether a job in flight recorded its end within END_WAIT_S."""
        now = time.monotonic()
        for flight in self.in_flight.values():
            if flight.recorded_end is None and recorded_end(flight.job.run):
                flight.recorded_end = now
        return any(f.recorded_end is not None and now - f.recorded_end < END_WAIT_S for f in self.in_flight.values())

    def overtime(self, flight: Flight, info: JobInfo) -> None:
        why = (
            f"{flight.job.title} still {info.detail} {flight.limit_s:.0f} s after it started (timeouts.job_s + margin)"
        )
        try:
            flight.job.cancel()
            why += "; cancelled"
        except LaunchError as e:
            why += f"; cancelling it failed: {e}"
        del self.in_flight[flight.name]
        self.end(self.sdir.states[flight.name], "failed", why)

    def finish(self, flight: Flight, info: JobInfo) -> None:
        """The job ended: its outcome read and recorded."""
        self.in_flight.pop(flight.name, None)
        state = self.sdir.states[flight.name]
        run = flight.job.run
        status = self._settled_status(run)
        outcome = read_outcome(run.path, state.candidate, self.slos, confidence=self.spec.repetitions.confidence)
        succeeded = status is not None and status.get("state") == "succeeded"
        # The job's ladder search ended normally: its answer stands even where the job then exited
        # failed (the client exits 1 when a measured point had failed requests, as a fixed sweep does).
        measured = succeeded or outcome.done
        why_failed = str((status or {}).get("reason") or f"{flight.job.title} ended {info.detail}")
        if info.state is JobState.CANCELLED and self.interrupted is None:
            self.stop_reason = f"{flight.job.title} of {flight.name} was cancelled outside the search"
            self.end(state, "cancelled", f"{flight.job.title} was cancelled ({info.detail})", outcome)
        elif self.interrupted is not None and not measured:
            why = f"the search was stopped by {signal.Signals(self.interrupted).name}"
            self.end(state, "cancelled", why, outcome)
        elif measured:
            note = "" if succeeded else f" (its SLO search ended; the job then failed: {why_failed})"
            self.end(state, "done", _summary(outcome) + note, outcome)
        else:
            self.end(state, "failed", why_failed, outcome)

    def end(self, state: CandidateState, status: Status, reason: str, outcome: CandidateOutcome | None = None) -> None:
        self.sdir.put(
            state.update(
                status=status, reason=reason, ended_at=time.time(), outcome=outcome.to_json() if outcome else None
            )
        )
        job = f" ({state.job_id})" if state.job_id else ""
        say(f"{state.name}: {status}{job}: {reason}")

    def cancel_in_flight(self, why: str) -> None:
        """Cancel every job in flight and wait (bounded) for them to end; each recorded cancelled."""
        for flight in self.in_flight.values():
            try:
                flight.job.cancel()
                say(f"{flight.name}: cancelling {flight.job.title}")
            except LaunchError as e:
                say(f"{flight.name}: cancelling {flight.job.title} failed: {e}")
        deadline = time.monotonic() + CANCEL_WAIT_S
        while self.in_flight and time.monotonic() < deadline:
            for flight in list(self.in_flight.values()):
                try:
                    if flight.job.state().finished:
                        del self.in_flight[flight.name]
                except LaunchError:
                    pass
            if self.in_flight:
                time.sleep(1)
        for flight in self.in_flight.values():
            say(f"{flight.name}: {flight.job.title} did not end within {CANCEL_WAIT_S:.0f} s of its cancel")
        for name, state in self.sdir.states.items():
            if state.status == "running":
                self.end(state, "cancelled", why)
                self.in_flight.pop(name, None)

    # --- the books -------------------------------------------------------------------------

    def finished(self) -> list[tuple[Candidate, CandidateOutcome]]:
        return [
            (s.candidate, CandidateOutcome.from_json(s.outcome))
            for s in self.sdir.states.values()
            if s.status == "done" and s.outcome is not None and s.candidate.kind == "disagg"
        ]

    def jobs_launched(self) -> int:
        return sum(len(s.earlier_runs) + (s.job_id is not None) for s in self.sdir.states.values())

    def device_hours_spent(self) -> float:
        """Devices x wall over the finished jobs (the outcome's figure, else the search's own times)."""
        total = 0.0
        for s in self.sdir.states.values():
            if s.status not in ("done", "failed", "cancelled") or s.started_at is None:
                continue
            cost = (s.outcome or {}).get("cost") or {}
            hours = cost.get("device_hours")
            if hours is None and s.ended_at is not None:
                hours = s.candidate.devices * (s.ended_at - s.started_at) / 3600
            total += hours or 0.0
        for s in self.sdir.states.values():  # earlier attempts' jobs spent too
            total += sum(((o.get("cost") or {}).get("device_hours") or 0.0) for o in s.earlier_outcomes)
        return total

    def mean_wall_s(self) -> float | None:
        walls = [
            w
            for s in self.sdir.states.values()
            if s.status == "done" and isinstance(w := ((s.outcome or {}).get("cost") or {}).get("wall_s"), int | float)
        ]
        return sum(walls) / len(walls) if walls else None

    def nodes_in_flight(self) -> int:
        return sum(self.sdir.states[n].candidate.nodes for n in self.in_flight)

    def _node_budget(self) -> float:
        n = self.spec.budget.nodes_in_flight
        return float("inf") if n is None else n

    def _limit_s(self, c: Candidate) -> float:
        try:
            return load(self.spec.recipe, list(c.overrides), self.spec.cluster).recipe.timeouts.job_s + self.margin_s
        except Refused:
            return self.margin_s

    def _settled_status(self, run: RunDir) -> dict[str, Any] | None:
        """status.json, waiting (bounded) for it to appear complete: NFS shows another host's files
        late. No wait where no node of the job started (a job cancelled while queued): nothing
        will write its status."""
        settle = time.monotonic() + STATUS_SETTLE_S
        status = read_status(run)
        if status is None and not _started(run):
            return None
        while (status is None or status.get("finished_at") is None) and time.monotonic() < settle:
            time.sleep(1)
            status = read_status(run)
        return status

    def entries(self) -> list[ReportEntry]:
        return [
            ReportEntry(
                s.candidate,
                EXCLUDED if s.status == "excluded" else s.status,
                s.reason,
                self.sdir.run_path(s),
                CandidateOutcome.from_json(s.outcome) if s.outcome else None,
                tuple(CandidateOutcome.from_json(o) for o in s.earlier_outcomes),
                s.forecast,
                s.pruned_by,
            )
            for s in self.sdir.states.values()
        ]

    def report(self) -> None:
        paths = write_report(self.sdir.path, self.spec.concurrency, self.slos, self.entries(), title=self.loaded.name)
        say(f"report: {', '.join(str(p) for p in paths)}")

    def exit_code(self) -> int:
        if self.interrupted is not None:
            say(f"interrupted; resume with: {self.resume}")
            return exit_codes.INTERRUPTED
        unfinished = [s.name for s in self.sdir.states.values() if s.status not in FINAL]
        if self.stop_reason is not None or unfinished:
            why = self.stop_reason or f"{', '.join(unfinished)} did not finish"
            say(f"stopped: {why}; resume with: {self.resume}")
            return 1
        return 0

    # --- signals ---------------------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and self.interrupted is None:
            time.sleep(min(1.0, end - time.monotonic()))
        if self.interrupted is not None:
            raise _Interrupted

    @contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM stop the search; while a foreground job runs, its launcher gets
        them too (as Ctrl-C) and tears the job down first."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(signum: int, _frame: object) -> None:
            self.interrupted = signum
            if self.foreground:
                raise KeyboardInterrupt

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _Interrupted(Exception):
    """The search got SIGINT or SIGTERM: stop launching, cancel what flies."""


def _predicted(f: foresee.Forecast, slos: Mapping[str, Any]) -> str:
    parts = [f"{slo}: {f.slos[slo].text()}" for slo in slos if slo in f.slos]
    why = (
        f"extrapolating ({'; '.join(f.extrapolating)})"
        if f.extrapolating
        else ", ".join(f"{k} not predicted" for k in f.unjudged) or "the band reaches the best measured"
    )
    return f"predicted {'; '.join(parts)}: measured, {why}"


def _summary(outcome: CandidateOutcome) -> str:
    parts = []
    for name, o in outcome.slos.items():
        if o.best is None or o.interval is None:
            parts.append(f"{name}: no concurrency meets it")
        else:
            i = o.interval
            spread = f" ± {i.half_width:.1f}" if math.isfinite(i.half_width) else ""
            parts.append(f"{name}: best c={o.best}, {i.mean:.1f}{spread} tok/s per device (n={i.n})")
    return "; ".join(parts)
