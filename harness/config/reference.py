"""docs/recipe-reference.md, generated from the schema (the one place keys are declared).

    python -m harness.config.reference > docs/recipe-reference.md

tests/config/test_config_reference.py fails when the committed file differs from this output.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from harness.config.schema import Catalogue, Recipe

HEADER = """# Recipe and model reference

Generated from pdbench's schema by `python -m harness.config.reference > docs/recipe-reference.md`;
do not edit by hand. Every key is optional unless marked **required**. Unknown keys are errors.
A recipe (`recipes/<name>.yaml`) names a model of `models.yaml`; `--set key=value` overrides any
key of a recipe (dotted path, YAML value). `pdbench validate RECIPE` checks a recipe without rendering.
"""


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " | ".join(names) + (" | null" if type(None) in args else "")
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"map {_type_name(args[0])} -> {_type_name(args[1])}" if args else "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if annotation is Any:
        return "any"
    return {int: "integer", float: "number", str: "string", bool: "boolean"}.get(annotation, str(annotation))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, float) and math.isinf(value):
        return "`inf`"
    if value is None:
        return ""
    return f"`{json.dumps(value)}`"


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The sections a field holds: itself, or the value model of a dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", text).replace("|", "\\|").strip()


def _section(title: str, model: type[BaseModel], prefix: str, out: list[str]) -> None:
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        subs = _models(field.annotation)
        doc = field.description or ""
        if field.examples:
            doc = doc.rstrip(".") + "." + " Example: " + ", ".join(f"`{json.dumps(e)}`" for e in field.examples) + "."
        rows.append(f"| `{key}` | {_cell(_type_name(field.annotation))} | {_default(field)} | {_cell(doc)} |")
        for sub in subs:
            sub_prefix = f"{key}.<name>." if typing.get_origin(field.annotation) is dict else f"{key}."
            nested.append((sub_prefix.rstrip("."), sub, sub_prefix))
    out += [f"## {title}", "", "| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for sub_title, sub, sub_prefix in nested:
        _section(f"`{sub_title}`", sub, sub_prefix, out)


def render_reference() -> str:
    out = [HEADER]
    _section("Recipe (`recipes/<name>.yaml`)", Recipe, "", out)
    _section("Model catalogue (`models.yaml`)", Catalogue, "", out)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render_reference(), end="")
