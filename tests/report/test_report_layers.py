"""harness/report/ is built in layers, model -> load -> compute -> render -> cli: a module imports
only modules of its own layer or of lower ones, and no import circle runs through the package.
Read from the source (every import, those inside functions too), so nothing has to be imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPORT = Path(__file__).resolve().parents[2] / "harness" / "report"
LAYERS = {
    "model": {"points", "model", "slo", "collect_entry"},
    "load": {"result_names", "result_file", "accuracy_file", "load", "client_points"},
    "compute": {
        "normalise",
        "pareto",
        "deltas",
        "explain",
        "breakdown",
        "bottleneck",
        "kv_handoff",
        "profile",
        "decide",
        "outputs_check",
        "accuracy",
        "run_summary",
        "build",
        "workloads",
        "crosscheck",
        "slo_pick",
        "point_slo",
        "deployment",
        "truth",
        "truth_text",
        "energy",
        "arms",
        "predicted",
        "prior",
    },
    "render": {
        "cells",
        "check_text",
        "export",
        "decision_text",
        "decision_plot",
        "breakdown_table",
        "breakdown_plot",
        "pareto_plot",
        "output_md",
        "output_html",
        "output_csv",
        "output_json",
        "output_text",
        "text_fit",
        "collect",
    },
    "cli": {"formats", "report_commands"},
}
RANK = {name: i for i, layer in enumerate(LAYERS.values()) for name in layer}


def _imports(path: Path) -> set[str]:
    """The harness.report modules that `path` imports, anywhere in the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "harness.report":
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness.report."):
            out.add(node.module.split(".")[2])  # type: ignore[union-attr]
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[2] for a in node.names if a.name.startswith("harness.report.")}
    return out


def _graph() -> dict[str, set[str]]:
    return {p.stem: _imports(p) for p in sorted(REPORT.glob("*.py")) if p.stem != "__init__"}


def test_every_module_has_a_layer() -> None:
    graph = _graph()
    assert len(graph) > 20  # the walk found the package
    assert sorted(set(graph) - set(RANK)) == [], "place each new module in a layer of LAYERS"
    assert sorted(set(RANK) - set(graph)) == [], "LAYERS names a module that is gone"


def test_no_module_imports_a_higher_layer() -> None:
    graph = _graph()
    assert graph["build"] >= {"load", "decide", "deltas"}  # the walk sees real imports
    upward = sorted((m, i) for m, imports in graph.items() for i in imports if RANK[i] > RANK[m])
    assert upward == []


def test_no_import_circle() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path[path.index(module) :], module))}"
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
