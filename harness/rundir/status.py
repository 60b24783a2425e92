"""A job's outcome records: the failures its nodes and launcher record in state/, and status.json.

state/abort is the first failure of any kind (every node stops on it); state/root_cause the first
*primary* one (a cause, not a consequence). Both are written once, atomically, by whoever gets
there first: a node (harness.node), the local launcher, or the rendered scripts' `fail`.
status.json is written once the job ends: by node 0, or by the local launcher when node 0 could
not. A job whose head node was killed before writing it (Slurm's SIGKILL after KillWait) is read
from the failure records instead.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from harness import atomic
from harness.rundir.paths import RunDir

# The cause a node records when Slurm's warning before the time limit (sbatch --signal=USR2)
# stops the job: `pdbench node` and container.sh write it, status readers call such a job "timeout".
TIME_LIMIT_WARNING = (
    "Slurm warned that the job's time limit is near (sbatch --signal=USR2): the sweep was stopped "
    "before it; the points finished so far are kept"
)


@dataclass(frozen=True)
class Failure:
    """One failure of a job: where it happened, in which process, why, and the end of its log.

    A *primary* failure is a cause (a process of this node died, this node's servers never
    got healthy, the job was cancelled); a secondary one may be the consequence of a cause
    elsewhere (the benchmark client failed because a server on another node died). The
    job's reason is its first primary failure, else its first failure of any kind.
    """

    node: int | str  # a node id, or "launcher" for the local launcher itself
    cause: str
    process: str | None = None
    role: str | None = None
    log: str | None = None  # the process's log, relative to the run directory
    log_tail: str | None = None
    log_error: str | None = None  # the first error the log names (harness.node.log_error)
    primary: bool = True
    time: float = field(default_factory=time.time)

    @property
    def reason(self) -> str:
        where = "the local launcher" if self.node == "launcher" else f"node {self.node}"
        if self.process is None:
            return f"{where}: {self.cause}"
        return f"{self.process} ({self.role}) on {where} {self.cause}" + log_detail(
            self.log, self.log_tail, self.log_error
        )

    def to_json(self) -> dict:
        return dict(asdict(self), reason=self.reason)

    @classmethod
    def from_json(cls, data: dict) -> Failure:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def log_detail(log: str | None, log_tail: str | None, log_error: str | None) -> str:
    """What a failure's reason tells after its cause: the first error its log states, then the
    log's last lines (a status.json's failure record read whole or field by field)."""
    text = f"; its log's first error: {log_error}" if log_error else ""
    if log:
        text += f"; last lines of {log}:\n{log_tail or '  (empty)'}"
    return text


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


class FailureRecords:
    """state/abort and state/root_cause of one run directory."""

    def __init__(self, run: RunDir):
        self.run = run

    def record(self, failure: Failure) -> None:
        """Record a failure; the first one of each kind stays, later ones are dropped."""
        self.run.state.mkdir(parents=True, exist_ok=True)
        if failure.primary:  # before the stop signal, so whoever stops on it finds the cause
            _write_once(self.run.root_cause, failure.to_json())
        _write_once(self.run.abort, failure.to_json())

    def has_failed(self) -> bool:
        return self.run.abort.is_file()

    def root_cause(self) -> Failure | None:
        data = _read_json(self.run.root_cause)
        return Failure.from_json(data) if data else None

    def first(self) -> Failure | None:
        """The job's reason: its first primary failure, else its first failure."""
        data = _read_json(self.run.root_cause) or _read_json(self.run.abort)
        return Failure.from_json(data) if data else None

    def abort_reason(self) -> str | None:
        data = _read_json(self.run.abort)
        return Failure.from_json(data).reason if data else None


def _write_once(path: Path, data: dict) -> None:
    # exactly one writer wins (atomic's link), and nobody sees a half-written file
    try:
        atomic.write_json(path, data, replace=False)
    except FileExistsError:
        pass


def _state(rc: int | None, failure: Failure | None) -> str:
    # A job stopped by the warning before its time limit is "timeout": partial, not broken.
    if failure is not None and failure.cause == TIME_LIMIT_WARNING:
        return "timeout"
    return "succeeded" if rc == 0 else "failed"


def write_status(run: RunDir, rc: int, failure: Failure | None) -> None:
    """status.json: the job's outcome and, when it failed, its first failure."""
    status = {
        "state": _state(rc, failure),
        "exit_code": rc,
        "reason": failure.reason if failure else None,
        "failure": failure.to_json() if failure else None,
        "results": run.result_names(),
        "finished_at": time.time(),
    }
    atomic.write_json(run.status, status, indent=2)


def read_status(run: RunDir) -> dict[str, Any] | None:
    """status.json; else the failure the nodes recorded in state/; None while neither exists."""
    if run.status.is_file():
        return json.loads(run.status.read_text())
    failure = FailureRecords(run).first() if run.state.is_dir() else None
    if failure is None:
        return None
    return {
        "state": _state(None, failure),
        "exit_code": None,
        "reason": failure.reason,
        "failure": failure.to_json(),
        "results": run.result_names(),
        "finished_at": None,
    }
