"""Exit codes have one owner, harness.exit_codes: no module defines its own name for one, and no
exit, Exit or _fail is given a bare number other than 0."""

from __future__ import annotations

import ast
from pathlib import Path

from harness import exit_codes

ROOT = Path(__file__).resolve().parent.parent
EXITS = ("Exit", "exit", "_exit", "_fail", "SystemExit")


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _bare_codes(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id.startswith("EXIT_") for t in node.targets
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno}: an exit code of its own")
        if isinstance(node, ast.Call) and _name(node.func) in EXITS:
            args = [*node.args, *(k.value for k in node.keywords if k.arg == "code")]
            for a in args:
                if isinstance(a, ast.Constant) and type(a.value) is int and a.value != 0:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {_name(node.func)}(..., {a.value})")
    return found


def test_the_codes_are_the_documented_ones() -> None:
    assert (exit_codes.FAILED, exit_codes.USAGE, exit_codes.TIMED_OUT, exit_codes.INTERRUPTED) == (1, 2, 124, 130)


def test_every_exit_code_comes_from_harness_exit_codes(tmp_path: Path) -> None:
    # Precondition: the reader finds a code of a module's own and bare codes in each form.
    planted = tmp_path / "planted.py"
    planted.write_text("import typer\nEXIT_CONFIG = 2\nraise typer.Exit(code=2)\ntyper.Exit(130)\n_fail('x', 2)\n")
    assert len(_bare_codes(planted, tmp_path)) == 4
    files = [p for p in sorted((ROOT / "harness").rglob("*.py")) if p.name != "exit_codes.py"]
    assert [f for p in files for f in _bare_codes(p)] == []
