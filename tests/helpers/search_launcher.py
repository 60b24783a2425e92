"""A fake launcher for the search tests: each candidate's job leaves its run directory as a finished
job would, with points from set throughputs.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from harness import atomic
from harness.launch.job import Job, JobInfo, JobState
from harness.launch.launcher import Launcher
from harness.rundir import RunDir
from harness.rundir.result_name import ResultName
from harness.search.driver import Search, prepare
from harness.search.search_dir import SearchDir
from harness.search.space import Candidate

LADDER = [1, 2, 4]

TIGHT = {"ttft_p90": 800.0}

SEARCH: dict[str, Any] = {
    "recipe": "tiny-fp32-cpu-nixl-1p2d",
    "cluster": "local",
    # Every worker its own device, as on GPUs: the world (helpers.search_world) gives each its own
    # server, and the predictor reads the same from the plan (no two workers bound to one core).
    "set": ["topology.prefill.cpu_bind=[]", "topology.decode.cpu_bind=[]"],
    "factors": {
        "prefill": [
            {"topology.prefill.workers": 1, "topology.prefill.nodes": 1},
            {"topology.prefill.workers": 2, "topology.prefill.nodes": 2},
        ],
        "decode": [
            {"topology.decode.workers": 1, "topology.decode.nodes": 1},
            {"topology.decode.workers": 2, "topology.decode.nodes": 2},
        ],
    },
    "constraints": {"max_devices": 3},
    "slos": {"tight": TIGHT},
    "concurrency": LADDER,
    "repetitions": {"max": 0},
    "baseline": {"set": ["topology.aggregated.port=8300"]},
    "prune": {"enabled": False},
}

# Per candidate: total tok/s per concurrency, and the concurrency above which TTFT breaks the SLO.
MEASURES = {"1p1d": (100.0, 2), "1p2d": (200.0, 4), "2p1d": (120.0, 2), "agg2": (90.0, 2), "agg3": (150.0, 2)}


def point(candidate: Candidate, conc: int, started: float) -> dict[str, Any]:
    """A result file as `pdbench bench` writes one (the keys the outcome reads, by their real names)."""
    per_c, knee = MEASURES[candidate.name]
    agg = candidate.kind == "agg"
    meta: dict[str, Any] = {
        "disagg": not agg,
        "recipe": "tiny-fp32-cpu-nixl-1p2d",
        "valid": True,
        "validity": {"verdict": "valid", "valid": True, "reasons": []},
    }
    meta |= (
        {"gpus": candidate.devices}
        if agg
        else {"prefill_gpus": candidate.prefill_devices, "decode_gpus": candidate.decode_devices}
    )
    ttft = 100.0 if conc <= knee else 2000.0
    return {
        "backend": "openai",
        "model_id": "tiny",
        "num_prompts": 8,
        "request_rate": "inf",
        "max_concurrency": conc,
        "random_input_len": 256,
        "random_output_len": 32,
        "duration": 2.0,
        "benchmark_start_time_unix": started,
        "benchmark_end_time_unix": started + 2.0,
        "completed": 8,
        "failed": 0,
        "total_input_tokens": 2048,
        "total_output_tokens": 256,
        "request_throughput": 4.0,
        "output_throughput": per_c * conc / 9,
        "total_token_throughput": per_c * conc,
        "mean_ttft_ms": ttft,
        "median_ttft_ms": ttft,
        "p90_ttft_ms": ttft,
        "p99_ttft_ms": ttft,
        "median_tpot_ms": 8.0,
        "mean_tpot_ms": 8.0,
        "p90_tpot_ms": 10.0,
        "p99_tpot_ms": 10.0,
        "median_itl_ms": 8.0,
        "p90_itl_ms": 10.0,
        "median_e2el_ms": 400.0,
        "p90_e2el_ms": 450.0,
        "metadata": meta,
    }


class FakeJob(Job):
    launcher = "slurm"

    def __init__(self, run: RunDir, job_id: str, states: list[JobState], on_info: Callable[[int], None] | None = None):
        super().__init__(run, job_id)
        self.states = states
        self.polls = 0
        self.on_info = on_info
        self.returncode: int | None = None

    @property
    def title(self) -> str:
        return f"fake job {self.job_id}"

    def info(self) -> JobInfo:
        self.polls += 1
        if self.on_info is not None:
            self.on_info(self.polls)
        state = self.states[min(self.polls, len(self.states)) - 1]
        return JobInfo(state, state.name, returncode=self.returncode)

    def cancel(self) -> None:
        self.states = [JobState.CANCELLED]
        self.polls = 0
        atomic.write_json(self.run.status, {"state": "failed", "reason": "cancelled", "finished_at": time.time()})


class FakeLauncher(Launcher):
    """Writes each candidate's run directory as its finished job leaves it; its jobs answer `states`."""

    name = "fake"

    def __init__(
        self,
        states: dict[str, list[JobState]] | None = None,
        wall_s: float = 60.0,
        on_info: Callable[[str, int], None] | None = None,
    ):
        self.states = states or {}
        self.wall_s = wall_s
        self.on_info = on_info
        self.launched: list[str] = []
        self.jobs: dict[str, FakeJob] = {}
        self.sdir: SearchDir | None = None
        self.returncodes: dict[str, int] = {}  # a foreground job's exit status
        self.done: set[str] = set()  # candidates whose slo_search.json says the ladder search ended

    def dry_run(self, run: RunDir, num_nodes: int) -> str:
        return "fake"

    def launch(self, run: RunDir, num_nodes: int) -> Job:
        name = run.path.parent.parent.name  # runs/<candidate>/<recipe>/<run id>
        self.launched.append(name)
        assert self.sdir is not None, "give the fake launcher the search directory"
        candidate = self.sdir.states[name].candidate
        end = time.time()
        start = end - self.wall_s
        atomic.write_json(
            run.launch_record, {"launcher": "slurm", "job_id": str(len(self.launched)), "host": "h", "time": start}
        )
        for i, conc in enumerate(LADDER):
            if candidate.kind == "agg":
                rn = ResultName(conc, math.inf, gpus=candidate.devices)
            else:
                rn = ResultName(conc, math.inf, None, candidate.prefill_devices, candidate.decode_devices)
            (run.path / rn.filename).write_text(json.dumps(point(candidate, conc, start + 10 * i)))
        if name in self.done:
            slos = {"tight": TIGHT}
            atomic.write_json(run.slo_search, {"ladder": LADDER, "slos": slos, "best": {"tight": 2}, "done": True})
        states = self.states.get(name, [JobState.RUNNING, JobState.COMPLETED])
        if states[-1] is JobState.COMPLETED:
            atomic.write_json(run.status, {"state": "succeeded", "exit_code": 0, "reason": None, "finished_at": end})
        elif states[-1] is JobState.FAILED:
            atomic.write_json(
                run.status, {"state": "failed", "exit_code": 1, "reason": "a node failed", "finished_at": end}
            )
        elif states[-1] is JobState.CANCELLED:  # as `scancel` leaves it: the nodes recorded their end
            atomic.write_json(
                run.status, {"state": "failed", "exit_code": 1, "reason": "cancelled", "finished_at": end}
            )
        hook = self.on_info
        job = FakeJob(run, str(len(self.launched)), states, (lambda n: hook(name, n)) if hook else None)
        job.returncode = self.returncodes.get(name)
        self.jobs[name] = job
        return job


def start(tmp_path: Path, fake: FakeLauncher, **changes: Any) -> Search:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SEARCH, **changes}, sort_keys=False))
    s = prepare(
        str(path),
        search_dir=tmp_path / "search",
        results_dir=tmp_path / "results",
        launcher_kind="slurm",
        cluster=None,
        skip_flag_check=True,
    )
    s.make_launcher = lambda kind, rr: fake
    s.poll_s = 0.01
    fake.sdir = s.sdir
    return s


def statuses(s: Search) -> dict[str, str]:
    return {n: st.status for n, st in SearchDir(s.sdir.path).read_state().items()}
