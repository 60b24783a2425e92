"""Every path of a run directory, in one place (after submitit's JobPaths).

A run directory (results/<recipe>/<UTC timestamp>-<short id>/) is the contract between the
stages and machines of a job: render writes the scripts and the plan, the launcher records how
it ran the job, the nodes write logs, state/ records and the status, the benchmark client writes
one result per point with its /metrics evidence, and report/collect read it all back. Which stage
writes and which reads each file is listed in docs/architecture.md.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.rundir.result_name import ResultName


class RunNotFound(Exception):
    pass


class LockUnreadable(Exception):
    """A run's recipe.lock.yaml is missing, not YAML, or not a mapping; the message names the file."""


# Names relative to the run directory. Rendered scripts and the bench client get them from here.
PLAN = "plan.json"
LOCK = "recipe.lock.yaml"
JOB_SCRIPT = "job.slurm"
SERVER_SCRIPT = "server.sh"
CONTAINER_SCRIPT = "container.sh"
STATUS = "status.json"
LAUNCH = "launch.json"
NOT_SUBMITTED = "not-submitted.json"  # why a rendered run was never submitted (--dry-run, sbatch failed)
LEGACY_SLURM_JOB_ID = "slurm_job_id"  # what a Slurm submit recorded before launch.json
DOCTOR_MARKER = "doctor.json"  # the job checks and stops, starting nothing
LOGS = "logs"
STATE = "state"
NODES = "nodes"
METRICS = "metrics"
SUPERSEDED = "superseded"
PROXY_TIMINGS = "proxy-timings"
SENTINELS = "sentinels"
SENTINEL_REFERENCE = "reference.json"
EVALS = "evals"
ACCURACY_SUMMARY = "pdbench-accuracy.json"  # pdbench's verdict of one eval, beside lm-eval's files
SECRET = f"{STATE}/kv_secret"
KV_CEILING = "kv_ceiling.json"  # in state/: the same-job KV ceiling (harness.rundir.kv_ceiling)
PERF_PROFILE = "perf_profile.json"  # the per-role profile `pdbench predict` fitted (harness.rundir.perf_profile)
PRIOR_PREDICTION = "prediction.json"  # predicted before the run ran (harness.rundir.prior_prediction)
KV_SINK = "kv_sink.json"  # in state/: where decode-0's node listens for the KV ceiling's transfer
IMAGE_RECORD_GLOB = "image-*.json"
IMAGE_RECORD_JOB = "image-job.json"  # one image file for the whole job (enroot, apptainer)
PROC_RECORD_GLOB = "procs-node*.json"
SLURM_OUTPUT = "slurm-%j.out"  # sbatch --output; Slurm puts the job id in place of %j
# Another client's run of one point (aiperf, `vllm bench serve`): clients/<client>/conc_<C>/, laid
# out as InferenceX's agentic job lays out one point (its process_agentic_result.py reads it).
CLIENTS = "clients"
AIPERF_ARTIFACTS = "aiperf_artifacts"  # aiperf --output-artifact-dir: profile_export.jsonl and the rest
CLIENT_COMMAND = "benchmark_command.txt"  # the exact command line of the point's run
VLLM_BENCH_RESULT = "vllm-bench.json"  # `vllm bench serve --save-result` of the point
CLIENT_RUN = "client_run.json"  # how the run went: exit code, wall and CPU seconds of the client
# An SLO search inside the job (benchmark.slo_search): its steps and verdicts, and the points it
# measured again, each repeat k under repeats/<k>/ laid out as the run directory (result, evidence).
SLO_SEARCH = "slo_search.json"
REPEATS = "repeats"
# Router arms (proxy.arms): each arm after the job's own router measures the same servers into
# arms/<arm>/, laid out as the run directory (results, metrics/, sentinels/); the job's own router's
# points stay the run's results.
ARMS = "arms"
# Workloads (benchmark.workloads): each later sweep over the job's servers writes into
# workloads/<name>/, laid out as the run directory (results, metrics/, sentinels/, power/points/).
WORKLOADS = "workloads"
# GPU power (harness.power): each node's samples under power/raw/, one energy record per point
# under power/points/, and per phase the dcgm-power v1 package InferenceX's
# utils/aggregate_power_multinode.py reads (power/<phase>/: manifest.json, samples.csv, windows/).
POWER = "power"
POWER_RAW = f"{POWER}/raw"
POWER_POINTS = f"{POWER}/points"


def client_point_subdir(client: str, concurrency: int | str, phase: str = "disagg") -> str:
    """One external client's point: clients/<client>/conc_<C> (clients/aggregated/... for a baseline)."""
    base = CLIENTS if phase == "disagg" else f"{CLIENTS}/{phase}"
    return f"{base}/{client}/conc_{concurrency}"


def client_log_name(client: str, concurrency: int | str, phase: str = "disagg") -> str:
    """The stdout and stderr of one external client's point, in logs/."""
    return f"{client}-conc_{concurrency}" + ("" if phase == "disagg" else f"-{phase}")


def repeat_subdir(repeat: int) -> str:
    """Where repeat k (1..) of an SLO search's points goes: repeats/<k>."""
    return f"{REPEATS}/{repeat}"


def arm_subdir(arm: str) -> str:
    """Where a later router arm's points go: arms/<arm>."""
    return f"{ARMS}/{arm}"


def arm_bench_config_name(arm: str) -> str:
    """A later router arm's client settings: bench-arm-<arm>.json."""
    return f"bench-arm-{arm}.json"


def workload_subdir(name: str) -> str:
    """Where a workload's points go: workloads/<name>."""
    return f"{WORKLOADS}/{name}"


def workload_bench_config_name(name: str) -> str:
    """A workload's client settings: bench-workload-<name>.json."""
    return f"bench-workload-{name}.json"


def bench_config_name(phase: str) -> str:
    """The client's settings of one phase: bench.json (disaggregated), bench-<phase>.json."""
    return "bench.json" if phase == "disagg" else f"bench-{phase}.json"


def log_name(name: str) -> str:
    """A process's, node's (node<N>) or the client's (bench) log file, in logs/."""
    return f"{name}.log"


def server_record_name(server: str) -> str:
    """A server's interpreter and package versions, written by its node into state/."""
    return f"runtime-{server}.json"


def image_record_name(node: int | str) -> str:
    """The image one node ran (docker, podman); `node` may be a shell word such as "$NODE"."""
    return f"image-node{node}.json"


# Records in state/ and logs the rendered scripts write; `node` may be a shell word ("$NODE").
ROOT_CAUSE = "root_cause"
ABORT = "abort"


def exit_record_name(node: int | str) -> str:
    return f"exit-node{node}.json"


def script_names(node: str = "$NODE") -> dict[str, str]:
    """The run directory's names as the rendered scripts spell them (render passes them as `names`)."""
    return {
        "logs": LOGS,
        "state": STATE,
        "server_script": SERVER_SCRIPT,
        "container_script": CONTAINER_SCRIPT,
        "root_cause": ROOT_CAUSE,
        "abort": ABORT,
        "exit_record": exit_record_name(node),
        "failure_tmp": f".failure-node{node}",
        "container_log": f"{LOGS}/container-node{node}.log",
        "setup_log": f"{LOGS}/setup-node{node}.log",
        "heartbeat": f"heartbeat-node{node}",
        "slurm_job_record": f"slurm-job-node{node}",
        "setup_beat": f"setup-beat-node{node}",
    }


def power_package_subdir(phase: str) -> str:
    """One phase's dcgm-power v1 package: power/<phase> (power/disagg, power/aggregated)."""
    return f"{POWER}/{phase}"


def metrics_subdir(phase: str) -> str:
    """Where a phase's /metrics scrapes go, relative to the run directory."""
    return METRICS if phase == "disagg" else f"{METRICS}/{phase}"


def sentinels_subdir(phase: str) -> str:
    """Where a phase's sentinel answers go (reference.json, one <point tag>.json per point)."""
    return SENTINELS if phase == "disagg" else f"{SENTINELS}/{phase}"


def sentinel_record_name(point_tag: str) -> str:
    """One point's sentinel prompts, both answers and the comparison, in sentinels_subdir."""
    return f"{point_tag}.json"


def eval_subdir(phase: str, when: str) -> str:
    """One accuracy eval's artifacts (lm-eval's results, meta_env.json): evals/<phase>-<when>."""
    return f"{EVALS}/{phase}-{when}"


# Top-level JSON files of a run directory that are not results.
CONTROL_FILES = frozenset(
    {
        PLAN,
        STATUS,
        LAUNCH,
        NOT_SUBMITTED,
        DOCTOR_MARKER,
        SLO_SEARCH,
        PERF_PROFILE,
        PRIOR_PREDICTION,
        bench_config_name("disagg"),
        bench_config_name("aggregated"),
    }
)


@dataclass(frozen=True)
class RunDir:
    path: Path

    # --- finding and creating ---

    @classmethod
    def create(cls, results_root: Path, recipe_name: str) -> RunDir:
        """A new, empty run directory under results_root/recipe_name; never an existing one."""
        parent = results_root / recipe_name
        parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            path = parent / f"{stamp}-{secrets.token_hex(3)}"
            try:
                path.mkdir()  # exist_ok=False: a run directory is never reused
            except FileExistsError:
                continue
            (path / LOGS).mkdir()
            return cls(path)
        raise RuntimeError(f"could not create a new run directory under {parent}")

    @staticmethod
    def is_run_dir(path: Path) -> bool:
        return (Path(path) / PLAN).is_file()

    @classmethod
    def resolve(cls, ref: str, results_root: Path) -> RunDir:
        """A run directory path; a recipe name (its latest submitted run); a run id
        (<UTC timestamp>-<short id>) or its short id alone; or '<recipe>/<run id or short id>'."""
        p = Path(ref)
        if cls.is_run_dir(p):
            return cls(p.resolve())
        cand = results_root / ref
        if cls.is_run_dir(cand):
            return cls(cand.resolve())
        if cand.is_dir():
            runs = sorted(d for d in cand.iterdir() if cls.is_run_dir(d))
            if submitted := [d for d in runs if not cls(d).never_submitted]:
                return cls(submitted[-1].resolve())
            if runs:
                raise RunNotFound(
                    f"{ref}: no submitted run under {cand}, only {len(runs)} never submitted "
                    f"(a dry run or a failed sbatch; the latest: {runs[-1].name})"
                )
        recipe, _, run_ref = ref.rpartition("/")
        if run_ref and "/" not in recipe:
            matches = [r for r in cls.all_runs(results_root) if run_ref in (r.run_id, r.short_id)]
            matches = [r for r in matches if not recipe or r.recipe == recipe]
            if len(matches) == 1:
                return cls(matches[0].path.resolve())
            if matches:
                names = ", ".join(f"{r.recipe}/{r.run_id}" for r in matches)
                raise RunNotFound(f"{ref}: names {len(matches)} runs ({names}); name one as recipe/run-id")
        raise RunNotFound(
            f"{ref}: no run directory (a path, a recipe name under {results_root}, a run id or its short id, "
            "or recipe/run-id)"
        )

    @classmethod
    def all_runs(cls, results_root: Path) -> list[RunDir]:
        """Every run directory under results_root (<recipe>/<run id>), newest first."""
        if not results_root.is_dir():
            return []
        runs = [cls(d) for r in results_root.iterdir() if r.is_dir() for d in r.iterdir() if cls.is_run_dir(d)]
        return sorted(runs, key=lambda r: r._created(), reverse=True)

    def _created(self) -> tuple[str, int, str]:
        """Creation order: the run id's second, then (two runs in one second) when its lock was
        written, which render does once; the random part of the id would order them by chance."""
        try:
            written = self.lock.stat().st_mtime_ns
        except OSError:
            written = 0
        return self.run_id.rpartition("-")[0], written, self.recipe

    @property
    def run_id(self) -> str:
        """<UTC timestamp>-<short id>: the directory's name."""
        return self.path.name

    @property
    def short_id(self) -> str:
        """The random part of the run id (6 hex digits): enough to name a run."""
        return self.path.name.rpartition("-")[2]

    @property
    def recipe(self) -> str:
        return self.path.parent.name

    @property
    def launched(self) -> bool:
        """A launcher took the job (it recorded itself)."""
        return self.launch_record.is_file() or self.legacy_slurm_job_id.is_file()

    @property
    def never_submitted(self) -> bool:
        """`submit` rendered the run and submitted nothing (a dry run, a failed sbatch): it says so."""
        return self.not_submitted.is_file() and not self.launched

    # --- what render writes ---

    @property
    def plan(self) -> Path:
        return self.path / PLAN

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    def read_lock(self) -> dict[str, Any]:
        """The resolved recipe the run was rendered from (render writes it; harness.render.job)."""
        try:
            lock = yaml.safe_load(self.lock.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise LockUnreadable(f"{self.lock}: unreadable as a recipe lock ({e})") from None
        if not isinstance(lock, dict):
            raise LockUnreadable(f"{self.lock}: unreadable as a recipe lock (not a mapping)")
        return lock

    @property
    def job_script(self) -> Path:
        return self.path / JOB_SCRIPT

    @property
    def server_script(self) -> Path:
        return self.path / SERVER_SCRIPT

    @property
    def container_script(self) -> Path:
        return self.path / CONTAINER_SCRIPT

    def arm(self, arm: str) -> RunDir:
        """A later router arm's results, laid out as a run directory's (results(), metrics())."""
        return RunDir(self.path / arm_subdir(arm))

    def arm_bench_config(self, arm: str) -> Path:
        return self.path / arm_bench_config_name(arm)

    def workload(self, name: str) -> RunDir:
        """A workload's results, laid out as a run directory's (results(), metrics(), power_point())."""
        return RunDir(self.path / workload_subdir(name))

    def workloads(self) -> list[str]:
        """The names of the workloads that have a folder here, sorted."""
        root = self.path / WORKLOADS
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []

    def workload_bench_config(self, name: str) -> Path:
        return self.path / workload_bench_config_name(name)

    def bench_config(self, phase: str = "disagg") -> Path:
        return self.path / bench_config_name(phase)

    @property
    def doctor_marker(self) -> Path:
        return self.path / DOCTOR_MARKER

    def relative(self, path: Path) -> str:
        """PATH as the run directory's records name it (relative, so the directory can move)."""
        return str(path.relative_to(self.path))

    def read_plan(self) -> dict:
        return json.loads(self.plan.read_text())

    # --- what the launcher and the nodes write ---

    @property
    def launch_record(self) -> Path:
        return self.path / LAUNCH

    @property
    def legacy_slurm_job_id(self) -> Path:
        return self.path / LEGACY_SLURM_JOB_ID

    @property
    def not_submitted(self) -> Path:
        """Why the run was never submitted ({"reason": ...}), written by `pdbench submit`."""
        return self.path / NOT_SUBMITTED

    @property
    def status(self) -> Path:
        return self.path / STATUS

    @property
    def logs(self) -> Path:
        return self.path / LOGS

    def log(self, name: str) -> Path:
        """A process's, node's (node<N>) or the client's (bench) log."""
        return self.logs / log_name(name)

    def node_output(self, node: int) -> Path:
        """What a node's server.sh prints outside the node runtime's own log (the local launcher's)."""
        return self.logs / f"node{node}.out"

    @property
    def state(self) -> Path:
        return self.path / STATE

    @property
    def nodes(self) -> Path:
        return self.path / NODES

    def node_address(self, node: int | str) -> Path:
        return self.nodes / f"{node}.json"

    def proc_record(self, node: int) -> Path:
        return self.state / f"procs-node{node}.json"

    def proc_records(self) -> list[Path]:
        return sorted(self.state.glob(PROC_RECORD_GLOB))

    def preflight_record(self, node: int) -> Path:
        return self.state / f"preflight-node{node}.json"

    def server_record(self, server: str) -> Path:
        return self.state / server_record_name(server)

    @property
    def kv_ceiling(self) -> Path:
        return self.state / KV_CEILING

    @property
    def perf_profile(self) -> Path:
        return self.path / PERF_PROFILE

    @property
    def prior_prediction(self) -> Path:
        return self.path / PRIOR_PREDICTION

    @property
    def kv_sink(self) -> Path:
        return self.state / KV_SINK

    def image_records(self) -> list[Path]:
        return sorted(self.state.glob(IMAGE_RECORD_GLOB))

    @property
    def secret(self) -> Path:
        return self.path / SECRET

    # Cross-node coordination records (harness.node.coordination, harness.rundir.failures).
    @property
    def root_cause(self) -> Path:
        return self.state / ROOT_CAUSE

    @property
    def abort(self) -> Path:
        return self.state / ABORT

    @property
    def done(self) -> Path:
        return self.state / "done"

    def phase_done(self, phase: str) -> Path:
        return self.state / f"done-{phase}"

    def exit_record(self, node: int | str) -> Path:
        return self.state / exit_record_name(node)

    # --- what the benchmark client writes ---

    @property
    def proxy_timings(self) -> Path:
        return self.path / PROXY_TIMINGS

    def power_samples(self, node: int) -> Path:
        """One node's GPU power samples (harness.rundir.power_samples)."""
        return self.path / POWER_RAW / f"node{node}.csv"

    def power_record(self, node: int) -> Path:
        """What one node's power sampler used, or why it has nothing."""
        return self.path / POWER_RAW / f"node{node}.json"

    def power_package(self, phase: str) -> Path:
        return self.path / power_package_subdir(phase)

    def power_point(self, result_name: str) -> Path:
        """A point's energy and cost, named after its result file."""
        return self.path / POWER_POINTS / result_name

    def metrics(self, phase: str = "disagg") -> Path:
        return self.path / metrics_subdir(phase)

    def sentinels(self, phase: str = "disagg") -> Path:
        return self.path / sentinels_subdir(phase)

    def sentinel_record(self, point_tag: str, phase: str = "disagg") -> Path:
        return self.sentinels(phase) / sentinel_record_name(point_tag)

    def sentinel_reference(self, phase: str = "disagg") -> Path:
        return self.sentinels(phase) / SENTINEL_REFERENCE

    def evals(self, phase: str, when: str) -> Path:
        return self.path / eval_subdir(phase, when)

    def accuracy_summary(self, phase: str, when: str) -> Path:
        return self.evals(phase, when) / ACCURACY_SUMMARY

    def accuracy_summaries(self) -> list[Path]:
        """Every eval's summary of the run, sorted by name."""
        return sorted(self.path.glob(f"{EVALS}/*/{ACCURACY_SUMMARY}"))

    @property
    def clients(self) -> Path:
        """Where other clients than pdbench's (aiperf, `vllm bench serve`) keep their points."""
        return self.path / CLIENTS

    def client_point(self, client: str, concurrency: int, phase: str = "disagg") -> Path:
        return self.path / client_point_subdir(client, concurrency, phase)

    def client_points(self, client: str, phase: str = "disagg") -> dict[int, Path]:
        """An external client's point directories of the run, by concurrency."""
        parent = self.client_point(client, 1, phase).parent
        found = parent.glob("conc_*") if parent.is_dir() else []
        return {int(d.name[5:]): d for d in found if d.is_dir() and d.name[5:].isdigit()}

    def client_log(self, client: str, concurrency: int, phase: str = "disagg") -> Path:
        return self.log(client_log_name(client, concurrency, phase))

    @property
    def slo_search(self) -> Path:
        return self.path / SLO_SEARCH

    def results(self) -> list[Path]:
        """The result files of the run (one per point), sorted by name."""
        return sorted(self.path.glob(ResultName.GLOB))

    def result_names(self) -> list[str]:
        return [p.name for p in self.results()]

    @property
    def superseded(self) -> Path:
        return self.path / SUPERSEDED

    # --- reading logs back ---

    def log_files(self, node: int | None = None, role: str | None = None) -> list[Path]:
        """Logs of the run, optionally of one node and/or one role (prefill, decode, proxy, bench, node)."""
        plan = self.read_plan()
        names: list[str] = []
        for proc in plan["processes"]:
            if node is not None and proc["node"] != node:
                continue
            proc_role = "proxy" if proc["kind"] == "proxy" else proc["name"].split("-")[0]
            if role is None or role == proc_role:
                names.append(proc["name"])
        if role in (None, "bench") and node in (None, plan["proxy_node"]):
            names.append("bench")
        if role in (None, "node"):
            names += [f"node{i}" for i in range(plan["num_nodes"]) if node is None or node == i]
        return [self.log(n) for n in names if self.log(n).is_file()]
