"""The strict pydantic base has one owner, harness.strict: no other module writes its own
`extra="forbid"`, and a model built on it refuses an unknown key, naming it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.config.schema import ModelSpec
from harness.search.spec import Constraints
from harness.strict import FrozenStrict, Strict

ROOT = Path(__file__).resolve().parent.parent


def _own_forbids(path: Path) -> list[int]:
    """Lines of `extra="forbid"` given to a ConfigDict (or a model_config dict)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword)
        and node.arg == "extra"
        and isinstance(node.value, ast.Constant)
        and node.value.value == "forbid"
    ] + [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == "extra" for k in node.keys)
        and any(isinstance(v, ast.Constant) and v.value == "forbid" for v in node.values)
    ]


def test_no_module_but_harness_strict_forbids_extra_keys_itself(tmp_path: Path) -> None:
    # Precondition: the reader finds both spellings.
    planted = tmp_path / "planted.py"
    planted.write_text('model_config = ConfigDict(extra="forbid")\nmodel_config = {"extra": "forbid"}\n')
    assert _own_forbids(planted) == [1, 2]
    own = {
        str(p.relative_to(ROOT)): lines
        for p in sorted((ROOT / "harness").rglob("*.py"))
        if p.name != "strict.py" and (lines := _own_forbids(p))
    }
    assert own == {}


def test_models_on_the_base_refuse_unknown_keys_and_frozen_ones_refuse_changes() -> None:
    assert issubclass(ModelSpec, Strict) and issubclass(Constraints, FrozenStrict)
    with pytest.raises(ValidationError, match="precison\n  Extra inputs are not permitted"):
        ModelSpec.model_validate({"precision": "fp8", "precison": "bf16"})
    c = Constraints(max_devices=8)
    with pytest.raises(ValidationError, match="max_node\n  Extra inputs are not permitted"):
        Constraints.model_validate({"max_nodes": 1, "max_node": 2})
    with pytest.raises(ValidationError, match="frozen"):
        c.max_devices = 4  # type: ignore[misc]
