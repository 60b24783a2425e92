"""Load models.yaml and a recipe, apply --set overrides, resolve and fingerprint.

Every error is a ConfigError that names the file, the key path and what was expected.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from harness.config.schema import SAFE_NAME as _SAFE_NAME
from harness.config.schema import Catalogue, ModelSpec, Recipe

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(Exception):
    """Bad configuration; the CLI prints it and exits with code 2."""

    def __init__(self, file: Path | str, key: str, expected: str):
        self.file, self.key, self.expected = str(file), key, expected
        where = f"{self.file}: {key}: " if key else f"{self.file}: "
        super().__init__(where + expected)


@dataclass(frozen=True)
class ResolvedRecipe:
    """A validated recipe joined with its model entry; what every later stage reads."""

    name: str
    recipe: Recipe
    model: ModelSpec
    recipe_file: Path
    models_file: Path
    root: Path

    @property
    def served_model_name(self) -> str:
        return self.model.served_model_name or self.recipe.model

    @property
    def model_source(self) -> str:
        """Local path made absolute (relative to models.yaml), or the HF id."""
        if self.model.path is not None:
            p = Path(self.model.path)
            return str(p if p.is_absolute() else (self.models_file.parent / p).resolve())
        return self.model.hf_id  # type: ignore[return-value]

    def relocated(self, path: str, root: str | None) -> str:
        """A path under the project root, re-rooted at `root` (where the job sees the project)."""
        if root is None or not Path(path).is_absolute():
            return path
        try:
            return str(Path(root) / Path(path).relative_to(self.root.resolve()))
        except ValueError:
            return path

    @property
    def tokenizer(self) -> str:
        if self.model.tokenizer:
            p = Path(self.model.tokenizer)
            if not p.is_absolute() and (self.models_file.parent / p).exists():
                return str((self.models_file.parent / p).resolve())
            return self.model.tokenizer
        return self.model_source

    def locked(self) -> dict[str, Any]:
        """The fully resolved configuration, as written to recipe.lock.yaml."""
        return {
            "name": self.name,
            "recipe": self.recipe.model_dump(mode="json"),
            "model": {"name": self.recipe.model, **self.model.model_dump(mode="json")},
        }

    @property
    def fingerprint(self) -> str:
        canonical = json.dumps(self.locked(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        raise ConfigError(path, "", f"{line}invalid YAML ({getattr(e, 'problem', e)})") from None


def _validation_error(path: Path, err: ValidationError, prefix: str = "") -> ConfigError:
    first = err.errors()[0]
    key = ".".join(str(p) for p in (prefix.split(".") if prefix else []) + list(first["loc"]))
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "missing":
        msg = "required key is missing"
    elif first["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")  # our validators' messages say what was got
    elif "input" in first:
        msg = f"{msg} (got {first['input']!r})"
    more = len(err.errors()) - 1
    if more:
        msg += f" (and {more} more error{'s' if more > 1 else ''})"
    return ConfigError(path, key or "(top level)", msg)


def _validate(model: type[BaseModel], data: Any, path: Path, prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(path, e, prefix) from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a','b','c'], value parsed as YAML so numbers and lists keep their type)."""
    if "=" not in text:
        raise ConfigError("--set", text, "expected KEY.PATH=VALUE")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError("--set", key, "expected a dotted key path such as benchmark.isl")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError("--set", ".".join(parts[: i + 1]), "is not a mapping")
            node = child
        node[parts[-1]] = value
    return data


def recipe_path(name_or_path: str, root: Path = PROJECT_ROOT) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return root / "recipes" / f"{name_or_path}.yaml"


def load_catalogue(path: Path) -> Catalogue:
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(path, "", "expected a mapping with a 'models' key")
    return _validate(Catalogue, data, path)


def load_recipe(
    name_or_path: str,
    overrides: list[str] | None = None,
    root: Path = PROJECT_ROOT,
    models_file: Path | None = None,
) -> ResolvedRecipe:
    path = recipe_path(name_or_path, root)
    if not path.is_file():
        available = sorted(p.stem for p in (root / "recipes").glob("*.yaml"))
        raise ConfigError(path, "", f"recipe not found (available: {', '.join(available) or 'none'})")
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(path, "", "expected a mapping of recipe keys")
    data = apply_overrides(data, overrides or [])
    recipe: Recipe = _validate(Recipe, data, path)

    models_file = models_file or root / "models.yaml"
    catalogue = load_catalogue(models_file)
    if recipe.model not in catalogue.models:
        raise ConfigError(
            path,
            "model",
            f"'{recipe.model}' is not in {models_file} (known: {', '.join(sorted(catalogue.models))})",
        )
    name = recipe.name or path.stem
    if recipe.name is None and not _SAFE_NAME.fullmatch(name):
        # The name becomes results/<name>/ and the job name; set `name:` to pick a safe one.
        raise ConfigError(
            path,
            "name",
            f"the file name {name!r} is not a safe name (letters, digits, "
            "'.', '_', '-', not starting with '.' or '-'); set 'name:'",
        )
    return ResolvedRecipe(name, recipe, catalogue.models[recipe.model], path.resolve(), models_file.resolve(), root)
