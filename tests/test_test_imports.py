"""Test modules share code through tests/helpers/ (and conftest's fixtures), never by importing
one another: a test module imported by another runs its module-level code (markers, skips,
fixtures) in a place it was not written for, and its private helpers become API by accident."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _names_a_test_module(dotted: str) -> bool:
    """`test_x...`, `tests.test_x...` or a relative `.test_x`: one of ours, not `aiohttp.test_utils`."""
    parts = dotted.lstrip(".").split(".")
    return parts[0].startswith("test_") or (parts[0] == "tests" and len(parts) > 1 and parts[1].startswith("test_"))


def imported_test_modules(source: str) -> list[str]:
    """The test modules (test_*) that `source` imports, anywhere in it, by any spelling."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _names_a_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if _names_a_test_module(module):
                found.append(module.lstrip("."))
                continue
            # `from tests import test_x`, `from . import test_x`: the module is one of the aliases.
            prefix = f"{module}." if node.module else module
            found += [f"{prefix}{a.name}".lstrip(".") for a in node.names if _names_a_test_module(prefix + a.name)]
    return sorted(set(found))


def test_the_check_sees_every_spelling_of_a_test_module_import() -> None:
    source = """
import test_a
import tests.test_b as b
from test_c import helper
from tests.test_d import helper as h
from tests import test_e
from . import test_g
def f():
    from test_f import late
from helpers.proxy_fakes import Fake
from conftest import require_vllm
import tests.helpers.cli_run
"""
    assert imported_test_modules(source) == [
        "test_a",
        "test_c",
        "test_f",
        "test_g",
        "tests.test_b",
        "tests.test_d",
        "tests.test_e",
    ]


def test_no_module_under_tests_imports_a_test_module() -> None:
    files = sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)
    assert len(files) > 100 and TESTS / "helpers" / "__init__.py" in files  # the tree was found
    offenders = {
        str(f.relative_to(TESTS)): mods for f in files if (mods := imported_test_modules(f.read_text(errors="replace")))
    }
    assert not offenders, f"import these from tests/helpers/ instead of from a test module: {offenders}"


def test_helpers_live_in_the_helpers_package() -> None:
    # Anything else at the top of tests/ would be importable by its bare name, beside the tests.
    loose = sorted(p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py")
    assert not loose, f"move these into tests/helpers/: {loose}"
