"""The search directory and the search's run: order, budget, pruning, resume, stops.

Jobs here are a fake launcher's, which writes each candidate's run directory as a finished job
leaves it (a fake isolates the orchestration; tests/test_search_e2e.py runs real jobs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.search.layout import CandidateState, SearchDir, SearchDirError, differences
from harness.search.space import Candidate

C1 = Candidate("1p1d", "disagg", ("topology.decode.workers=1",), 1, 1, 2, {"prefill": 1.0, "decode": 1.0})


def test_the_state_round_trips_through_state_json(tmp_path: Path) -> None:
    sdir = SearchDir(tmp_path / "s")
    assert sdir.begin({"spec": {"a": 1}}) is False
    state = CandidateState(
        C1, "failed", "boom", "runs/1p1d/r/1", "42", 1.0, 2.0, 3.0, {"x": 1}, ("runs/old",), ({"y": 2},)
    )
    sdir.put(state)
    again = SearchDir(tmp_path / "s")
    assert again.begin({"spec": {"a": 1}}) is True
    assert again.states == {"1p1d": state}
    data = json.loads((tmp_path / "s" / "state.json").read_text())
    entry = data["candidates"][0]
    assert entry["devices"] == 2 and entry["status"] == "failed" and entry["run"] == "runs/1p1d/r/1"


def test_another_search_in_the_directory_is_refused_naming_what_differs(tmp_path: Path) -> None:
    sdir = SearchDir(tmp_path / "s")
    sdir.begin({"launcher": "slurm", "spec": {"concurrency": [1, 2], "prune": {"slack": 1.1}}})
    recorded = yaml.safe_load((tmp_path / "s" / "search.yaml").read_text())
    assert recorded["definition"]["spec"]["concurrency"] == [1, 2] and len(recorded["hash"]) == 16
    with pytest.raises(SearchDirError, match=r"spec\.concurrency, spec\.prune\.slack differ"):
        SearchDir(tmp_path / "s").begin({"launcher": "slurm", "spec": {"concurrency": [1, 4], "prune": {"slack": 1.2}}})


def test_differences_names_added_and_removed_keys() -> None:
    assert differences({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}, "d": 3}) == ["a.c", "d"]
    assert differences({"a": [1]}, {"a": [1]}) == []


def test_paths_of_the_search_directory(tmp_path: Path) -> None:
    sdir = SearchDir(tmp_path)
    assert sdir.results_dir("1p2d") == tmp_path / "runs" / "1p2d"
    assert [p.name for p in (sdir.report_md, sdir.report_json, sdir.pareto)] == [
        "report.md",
        "report.json",
        "pareto.png",
    ]
    assert sdir.relative(tmp_path / "runs" / "1p2d" / "x") == "runs/1p2d/x"
