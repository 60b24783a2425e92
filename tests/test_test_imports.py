"""Test modules share code through tests/helpers/ (and conftest's fixtures), never by importing
one another: a test module imported by another runs its module-level code (markers, skips,
fixtures) in a place it was not written for, and its private helpers become API by accident."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: The folders of test modules, mirroring the packages (bench/, proxy/, ..., connector/, e2e/). They
#: are no packages: pytest imports a module in one by its bare name, as one at the top, and with
#: tests/ on sys.path a folder is importable as a namespace package, so `bench.test_x` names one too.
TEST_DIRS = frozenset(p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def _names_a_test_module(dotted: str) -> bool:
    """`test_x...`, `tests.test_x...`, `bench.test_x...`, `tests.bench.test_x...` or a relative
    `.test_x`: one of ours, not `aiohttp.test_utils`."""
    parts = dotted.lstrip(".").split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    if parts and parts[0] in TEST_DIRS:
        parts = parts[1:]
    return bool(parts) and parts[0].startswith("test_")


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
from bench.test_h import helper
import tests.proxy.test_i
from connector import config
"""
    assert imported_test_modules(source) == [
        "bench.test_h",
        "test_a",
        "test_c",
        "test_f",
        "test_g",
        "tests.proxy.test_i",
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


def _test_places() -> list[Path]:
    return [TESTS, *(TESTS / d for d in sorted(TEST_DIRS))]


def test_the_test_modules_are_in_their_folders() -> None:
    assert {"bench", "proxy", "connector", "e2e"} <= TEST_DIRS, TEST_DIRS  # the folders were found


def test_helpers_live_in_the_helpers_package() -> None:
    # Anything else at the top of tests/ or in a folder of test modules (an __init__.py too) would
    # be importable by its bare name, beside the tests.
    loose = sorted(
        str(p.relative_to(TESTS))
        for place in _test_places()
        for p in place.glob("*.py")
        if not p.name.startswith("test_") and not (place == TESTS and p.name == "conftest.py")
    )
    assert not loose, f"move these into tests/helpers/: {loose}"


def test_test_module_names_are_unique() -> None:
    # The folders are no packages: pytest imports each test module by its file name, and
    # conftest's VLLM_LANES is keyed by it, so two test_x.py in two folders would clash.
    names = Counter(p.name for place in _test_places() for p in place.glob("test_*.py"))
    twice = sorted(name for name, n in names.items() if n > 1)
    assert not twice, f"rename these, each is in more than one folder of tests/: {twice}"
