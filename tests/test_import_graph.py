"""The house's plan, read from the code: imports flow down the floors, never in a circle.

Every `import` and `from ... import` of the package counts, lazy ones inside functions too
(they are dependencies all the same); only `if TYPE_CHECKING:` blocks are left out. The floors
are docs/architecture.md's; a module may import its own floor or a lower one, and the arrows
listed in FORBIDDEN are refused even where the floors would allow them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "connector")

# The first matching prefix gives a module's floor.
FLOORS: tuple[tuple[str, int], ...] = (
    ("harness.cli", 7),
    ("harness.__main__", 7),
    ("harness.search", 6),
    ("harness.predict", 6),
    ("harness.report", 6),
    ("harness.submit", 6),
    ("harness.doctor", 6),
    ("harness.resume_run", 6),
    ("harness.node", 5),
    ("harness.proxy", 5),
    ("harness.bench", 5),
    ("harness.validity", 5),
    ("harness.mock_engine", 5),
    ("harness.evals", 5),
    ("harness.power", 5),
    ("harness.render", 4),
    ("harness.launch", 4),
    ("harness.topology", 3),
    ("harness.config", 2),
    ("harness.kv_connectors", 2),
    ("harness.rundir", 1),
    ("harness.supervisor", 1),
    ("harness.reaper", 1),
    ("harness.atomic", 1),
    ("harness.aio", 1),
    ("harness.limits", 1),
    ("harness.exit_codes", 1),
    ("harness.strict", 1),
    ("harness.tiny_model", 1),
    ("harness", 1),  # the package itself: __version__
)

# Arrows refused whatever the floors say: (importer prefix, imported prefix, why).
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("harness.bench", "harness.proxy", "the client reads shared records from harness.rundir, not the proxy"),
    ("harness.bench", "harness.node", "the client runs outside the node runtime"),
    ("harness.proxy", "harness.bench", "the proxy knows nothing of its clients"),
    ("harness.proxy", "harness.node", "the proxy is a process the node starts"),
    ("harness.node", "harness.proxy", "the node starts the proxy as a process"),
    ("harness.node", "harness.bench", "the node starts the client as a process"),
    ("harness.evals", "harness.proxy", "lm-eval talks to the proxy over HTTP"),
    ("harness.evals", "harness.node", "the node calls the evals, never the other way"),
    ("harness.report", "harness.node", "report reads run directories, never the node's internals"),
    ("harness.search", "harness.node", "a search submits jobs and reads their run directories"),
    ("harness.search", "harness.bench", "a search reads result files, never the client's internals"),
    ("harness.predict", "harness.node", "a prediction reads run directories and runs nothing"),
    ("harness.predict", "harness.bench", "a prediction reads result files, never the client's internals"),
    ("harness.render", "harness.node", "render prints what the plan says; names come from harness.rundir"),
    ("harness.launch", "harness.node", "a launcher starts nodes as processes"),
    ("harness.config", "harness.render", "configuration is read before anything is rendered"),
    ("harness.config", "harness.launch", "configuration is read before anything is launched"),
    ("harness.kv_connectors", "harness.", "the connector table is data of floor 2: it imports floor 1 only"),
    ("connector", "harness", "the bundled connector runs inside vLLM and imports nothing of harness"),
)
CONNECTOR_TABLE_MAY_IMPORT = ("harness.kv_connectors", "harness.rundir", "harness.atomic")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for each import of a package module; `from pkg import sub` names pkg.sub."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in known else target), node.lineno


def graph() -> dict[str, dict[str, int]]:
    mods = modules()
    known = set(mods)
    return {name: {t: line for t, line in imports_of(name, p, known) if t != name} for name, p in mods.items()}


def floor(name: str) -> int | None:
    return next((f for prefix, f in FLOORS if name == prefix or name.startswith(prefix + ".")), None)


def _under(name: str, prefix: str) -> bool:
    return name == prefix.rstrip(".") or name.startswith(prefix if prefix.endswith(".") else prefix + ".")


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next((w for w in it if w in g), None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_graph_is_read_from_the_code() -> None:
    g = graph()
    # Precondition: the reader sees real arrows of both import forms, lazy ones included.
    assert "harness.rundir.paths" in g["harness.rundir"]  # from harness.rundir.paths import ...
    assert "harness.rundir" in g["harness.node.coordination"]
    assert any(t.startswith("harness.") for t in g["harness.cli"])
    assert len(g) > 100


def test_a_planted_circle_and_a_wrong_arrow_are_found() -> None:
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert floor("harness.bench.sweep") == 5 and floor("harness.rundir.paths") == 1 and floor("harness") == 1


def test_no_import_circles() -> None:
    assert cycles(graph()) == []


def test_every_module_has_a_floor() -> None:
    assert [m for m in graph() if m.startswith("harness") and floor(m) is None] == []


def test_imports_flow_down_the_floors() -> None:
    g = graph()
    up = [
        f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)}) at line {line}"
        for m, targets in g.items()
        if m.startswith("harness")
        for t, line in targets.items()
        if (fm := floor(m)) is not None and (ft := floor(t)) is not None and ft > fm
    ]
    assert up == []


@pytest.mark.parametrize(("importer", "imported", "why"), FORBIDDEN, ids=[f"{a}->{b}" for a, b, _ in FORBIDDEN])
def test_forbidden_arrows(importer: str, imported: str, why: str) -> None:
    g = graph()
    bad = [
        f"{m} imports {t} at line {line}"
        for m, targets in g.items()
        if _under(m, importer)
        for t, line in targets.items()
        if _under(t, imported)
        and not (importer == "harness.kv_connectors" and t.startswith(CONNECTOR_TABLE_MAY_IMPORT))
    ]
    assert bad == [], why
