"""The search directory (results/searches/<name>/ by default), the one owner of its paths.

search.yaml     the search as it was run: the spec as loaded (with --set and the cluster
                folded in), the launcher, and their hash; a resume with another is refused
state.json      one entry per candidate (status, reason, run, job, times, outcome, the prediction
                made before it ran, the rule that pruned it), rewritten atomically after every change
runs/<candidate>/   the candidate's results directory: its run directories lie under it
report.md, report.json, pareto.png   the report (harness.search.report writes them)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast, get_args

import yaml

from harness import atomic
from harness.search.space import Candidate

LOCK_FILE = ".lock"
SEARCH_FILE = "search.yaml"
STATE_FILE = "state.json"
RUNS = "runs"
REPORT_MD = "report.md"
REPORT_JSON = "report.json"
PARETO = "pareto.png"

Status = Literal["planned", "running", "done", "failed", "cancelled", "skipped", "excluded"]
STATUSES: tuple[str, ...] = get_args(Status)
# Kept as they are by a resume; failed and cancelled candidates run again, running ones are re-attached.
FINAL = frozenset({"done", "skipped", "excluded"})


class SearchDirError(Exception):
    """A search directory that cannot be used for this search (another search's, or unreadable)."""


@dataclass(frozen=True)
class CandidateState:
    """A candidate's line of state.json."""

    candidate: Candidate
    status: Status
    reason: str = ""
    run: str | None = None  # relative to the search directory
    job_id: str | None = None
    planned_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    outcome: dict[str, Any] | None = None  # CandidateOutcome.to_json()
    earlier_runs: tuple[str, ...] = ()  # runs of earlier attempts (failed or cancelled), kept
    earlier_outcomes: tuple[dict[str, Any], ...] = ()  # their outcomes: they spent device-hours too
    forecast: dict[str, Any] | None = None  # harness.search.foresee.Forecast.to_json(), made before it ran
    pruned_by: str | None = None  # the rule that skipped it: throughput-bound, prediction, budget

    @property
    def name(self) -> str:
        return self.candidate.name

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "name": c.name,
            "kind": c.kind,
            "overrides": list(c.overrides),
            "devices": c.devices,
            "prefill_devices": c.prefill_devices,
            "decode_devices": c.decode_devices,
            "nodes": c.nodes,
            "capacity": dict(c.capacity),
            "status": self.status,
            "reason": self.reason,
            "run": self.run,
            "job_id": self.job_id,
            "planned_at": self.planned_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "outcome": self.outcome,
            "earlier_runs": list(self.earlier_runs),
            "earlier_outcomes": list(self.earlier_outcomes),
            "forecast": self.forecast,
            "pruned_by": self.pruned_by,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateState:
        if data["status"] not in STATUSES:
            raise ValueError(f"status {data['status']!r} is not one of {', '.join(STATUSES)}")
        candidate = Candidate(
            name=data["name"],
            kind=data["kind"],
            overrides=tuple(data["overrides"]),
            prefill_devices=int(data["prefill_devices"]),
            decode_devices=int(data["decode_devices"]),
            nodes=int(data["nodes"]),
            capacity={str(k): float(v) for k, v in data["capacity"].items()},
        )
        return cls(
            candidate,
            cast(Status, data["status"]),
            data.get("reason") or "",
            data.get("run"),
            data.get("job_id"),
            data.get("planned_at"),
            data.get("started_at"),
            data.get("ended_at"),
            data.get("outcome"),
            tuple(data.get("earlier_runs") or ()),
            tuple(data.get("earlier_outcomes") or ()),
            data.get("forecast"),
            data.get("pruned_by"),
        )

    def update(self, **changes: Any) -> CandidateState:
        return replace(self, **changes)


@dataclass
class SearchDir:
    path: Path
    # The candidates' states in the order they were first recorded (the grid's, then baselines).
    states: dict[str, CandidateState] = field(default_factory=dict)

    @property
    def search_file(self) -> Path:
        return self.path / SEARCH_FILE

    @property
    def state_file(self) -> Path:
        return self.path / STATE_FILE

    @property
    def report_md(self) -> Path:
        return self.path / REPORT_MD

    @property
    def report_json(self) -> Path:
        return self.path / REPORT_JSON

    @property
    def pareto(self) -> Path:
        return self.path / PARETO

    def results_dir(self, candidate: str) -> Path:
        """runs/<candidate>/: the results directory a candidate's run directories are created under."""
        return self.path / RUNS / candidate

    def run_path(self, state: CandidateState) -> Path | None:
        return None if state.run is None else self.path / state.run

    def relative(self, run: Path) -> str:
        return str(Path(run).resolve().relative_to(self.path.resolve()))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Held while a search process works in the directory: a second one (a resume started while
        the first still runs) would launch and follow the same jobs twice."""
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / LOCK_FILE, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                raise SearchDirError(
                    f"{self.path}: a search runs in it already ({holder}); wait for it or stop it"
                ) from None
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()}")
            f.flush()
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def begin(self, definition: Mapping[str, Any]) -> bool:
        """Record the search's definition, or check it is the one recorded. True when resuming."""
        self.path.mkdir(parents=True, exist_ok=True)
        digest = definition_hash(definition)
        if self.search_file.is_file():
            recorded = _read(self.search_file, yaml.safe_load)
            if not isinstance(recorded, dict) or recorded.get("hash") != digest:
                old = recorded.get("definition", {}) if isinstance(recorded, dict) else {}
                changed = differences(old, definition) or ["(the recorded file is not a search definition)"]
                raise SearchDirError(
                    f"{self.path} holds another search: {', '.join(changed)} differ from {self.search_file}; "
                    "run it with what it recorded, or give another search directory"
                )
            self.states = self.read_state()
            return True
        atomic.write_text(
            self.search_file, yaml.safe_dump({"hash": digest, "definition": dict(definition)}, sort_keys=False)
        )
        return False

    def read_state(self) -> dict[str, CandidateState]:
        if not self.state_file.is_file():
            return {}
        data = _read(self.state_file, json.loads)
        try:
            return {e["name"]: CandidateState.from_json(e) for e in data["candidates"]}
        except (KeyError, TypeError, ValueError) as e:
            raise SearchDirError(f"{self.state_file}: not a search state ({e!r})") from None

    def put(self, state: CandidateState) -> CandidateState:
        """Record one candidate's state and rewrite state.json (atomically)."""
        self.states[state.name] = state
        self.write_state()
        return state

    def write_state(self) -> None:
        atomic.write_json(
            self.state_file,
            {"updated_at": time.time(), "candidates": [s.to_json() for s in self.states.values()]},
            indent=2,
        )


def definition_hash(definition: Mapping[str, Any]) -> str:
    canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two definitions."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in [*old, *(k for k in new if k not in old)]:
            out += differences(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if _plain(old) == _plain(new) else [prefix or "(top level)"]


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _read(path: Path, parse: Any) -> Any:
    try:
        return parse(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise SearchDirError(f"{path}: unreadable ({e})") from None


def statuses(states: Iterable[CandidateState]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in states:
        out[s.status] = out.get(s.status, 0) + 1
    return out
