"""The sweep is a pipeline of pieces (docs/architecture.md, "The sweep"): each imports only the
pieces above it, the workload is chosen from one table, and no piece outside the workloads
branches on the dataset's name. Read from the source, so nothing has to run."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

from harness.bench.client_config import ClientConfig
from harness.bench.workloads import WORKLOADS, workload_for
from harness.config.benchmark import BenchmarkSettings

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "harness" / "bench"
# The pieces in order: a piece may import the ones before it, never one after it.
PIECES = [
    "scope",
    "workloads",
    "stops",
    "load_runner",
    "points",
    "sweep_sentinels",
    "point_runner",
    "slo_driver",
    "sweep",
]
RANK = {name: i for i, name in enumerate(PIECES)}


def _files(piece: str) -> list[Path]:
    return sorted((BENCH / piece).glob("*.py")) if (BENCH / piece).is_dir() else [BENCH / f"{piece}.py"]


def _pieces_imported(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.ImportFrom) and node.module == "harness.bench":
            names = [f"harness.bench.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {n.split(".")[2] for n in names if n.startswith("harness.bench.") and n.split(".")[2] in RANK}
    return out


def test_each_piece_imports_only_the_pieces_above_it() -> None:
    graph = {piece: set().union(*(_pieces_imported(f) for f in _files(piece))) - {piece} for piece in PIECES}
    assert graph["sweep"] >= {"point_runner", "slo_driver", "stops"}  # the walk sees real imports
    upward = sorted((p, i) for p, imports in graph.items() for i in imports if RANK[i] > RANK[p])
    assert upward == [], "a piece imports one below it in PIECES"


def test_no_piece_but_the_workloads_branches_on_the_dataset() -> None:
    dispatch = re.compile(r"\.dataset\s*(==|!=|in\b|not in\b)")
    found = [
        f"{f.relative_to(ROOT)}:{n}"
        for piece in PIECES
        if piece != "workloads"
        for f in _files(piece)
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if dispatch.search(line)
    ]
    assert [f for f in _files("workloads") if "WORKLOADS" in f.read_text()]  # the table is where it is read from
    assert found == [], "choose by the workload (harness.bench.workloads), not by comparing dataset names"


def test_every_dataset_the_config_accepts_has_a_workload() -> None:
    datasets = get_args(BenchmarkSettings.model_fields["dataset"].annotation)
    assert "mooncake_trace" in datasets and len(datasets) >= 5  # the Literal was read
    assert sorted(WORKLOADS) == sorted(datasets)
    sessions = ClientConfig(
        base_url="http://127.0.0.1:1",
        model="m",
        tokenizer="t",
        result_dir="/tmp/r",
        isl=8,
        osl=4,
        concurrency=[1],
        dataset="sessions",
    )
    assert not workload_for(sessions).in_workers  # a turn is built from the answer before it
    assert workload_for(sessions.model_copy(update={"dataset": "random"})).in_workers


def test_the_architecture_map_names_every_piece() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## The sweep", 1)[1].split("\n## ", 1)[0]
    missing = [p for p in PIECES if f"`bench/{p}" not in section]
    modules = [f.stem for f in _files("workloads") if f.stem not in ("__init__", "base")]
    missing += [m for m in modules if f"`{m}`" not in section]
    assert len(modules) >= 4 and missing == []
