"""The schema documents itself: every field has a description, and docs/recipe-reference.md
is what the schema generates."""

from __future__ import annotations

import typing

from pydantic import BaseModel

from harness.config.load import PROJECT_ROOT
from harness.config.reference import render_reference
from harness.config.schema import Catalogue, Recipe


def _fields(model: type[BaseModel], path: str = ""):
    for name, field in model.model_fields.items():
        yield f"{path}{name}", field
        stack = [field.annotation]
        while stack:
            a = stack.pop()
            if isinstance(a, type) and issubclass(a, BaseModel):
                yield from _fields(a, f"{path}{name}.")
            else:
                stack += typing.get_args(a)


def test_every_field_is_described() -> None:
    missing = [key for model in (Recipe, Catalogue) for key, f in _fields(model) if not (f.description or "").strip()]
    assert not missing, f"fields without a description: {missing}"


def test_reference_is_current() -> None:
    committed = (PROJECT_ROOT / "docs" / "recipe-reference.md").read_text()
    assert committed == render_reference(), (
        "docs/recipe-reference.md is stale: run `python -m harness.config.reference > docs/recipe-reference.md`"
    )


def test_reference_lists_every_key() -> None:
    text = render_reference()
    for key, _ in _fields(Recipe):
        assert f"| `{key.replace('models.', 'models.<name>.')}` |" in text, key
    assert "| `benchmark.goodput` |" in text and "| `models.<name>.max_model_len` |" in text
