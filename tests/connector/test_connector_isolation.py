"""The connector package is only what vLLM loads: it imports nothing of pdbench's harness."""

from __future__ import annotations

import ast
from pathlib import Path

CONNECTOR = Path(__file__).resolve().parents[2] / "connector"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_connector_imports_nothing_of_the_harness() -> None:
    files = sorted(CONNECTOR.glob("*.py"))
    assert len(files) > 5
    offending = {
        f.name: sorted(n for n in _imports(f) if n.split(".")[0] in ("harness", "benchmarks", "tests")) for f in files
    }
    assert not {k: v for k, v in offending.items() if v}, offending
