"""Load models.yaml and a recipe, apply its overrides (records), resolve and fingerprint.

Every error is a ConfigError that names the file, the key path and what was expected.
"""

from __future__ import annotations

import hashlib
import json
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from harness.config import yaml_bounded
from harness.config.cluster import ClusterProfile, profile_path
from harness.config.errors import ConfigError
from harness.config.overrides import Overrides, records
from harness.config.renamed import RENAMED
from harness.config.schema import SAFE_NAME as _SAFE_NAME
from harness.config.schema import Catalogue, ModelSpec, Recipe
from harness.config.spelling import did_you_mean

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ResolvedRecipe:
    """A validated recipe joined with its model entry; what every later stage reads."""

    name: str
    recipe: Recipe
    model: ModelSpec
    recipe_file: Path
    models_file: Path
    root: Path
    cluster_file: Path | None = None
    # Where each value of the recipe came from: dotted key -> a file, "--set KEY" or "default".
    provenance: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def served_model_name(self) -> str:
        return self.model.served_model_name or self.recipe.model

    @property
    def model_source(self) -> str:
        """Local path made absolute (relative to models.yaml), <site.model_root>/<hf_id>, or the HF id."""
        if self.model.path is not None:
            p = Path(self.model.path)
            return str(p if p.is_absolute() else (self.models_file.parent / p).resolve())
        if self.recipe.site.model_root:
            return str(Path(self.recipe.site.model_root) / self.model.hf_id)  # type: ignore[operator]
        return self.model.hf_id  # type: ignore[return-value]

    @property
    def weights_local(self) -> bool:
        """The servers load from a path (or a shared HF cache), never from the hub."""
        return self.model.path is not None or bool(self.recipe.site.model_root or self.recipe.site.hf_cache)

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

    def blame(self, key: str) -> str:
        """What gave the value at `key`, for an error: the recipe file, the cluster profile or `--set KEY`."""
        files = {_label(self.recipe_file, self.root): self.recipe_file}
        if self.cluster_file is not None:
            files[_label(self.cluster_file, self.root)] = self.cluster_file
        return blame(self.provenance, key, files, self.recipe_file)

    def file_values(self) -> dict[str, Any]:
        """The recipe file's own values, before a cluster profile and --set: dotted key -> value."""
        return _leaves(_read_yaml(self.recipe_file))

    def profile_values(self) -> dict[str, Any]:
        """The resolved values that the cluster profile gave: dotted key -> value."""
        if self.cluster_file is None:
            return {}
        label = _label(self.cluster_file, self.root)
        values = _leaves(self.recipe.model_dump(mode="json"))
        return {k: v for k, v in values.items() if _source_of(self.provenance, k) == label}

    def set_values(self) -> dict[str, Any]:
        """The resolved values that --set (or an option that sets a recipe key) gave: dotted key -> value."""
        values = _leaves(self.recipe.model_dump(mode="json"))
        return {k: v for k, v in values.items() if (_source_of(self.provenance, k) or "").startswith("--")}

    def locked(self) -> dict[str, Any]:
        """The fully resolved configuration (what the fingerprint covers)."""
        return {
            "name": self.name,
            # Without secrets the key is left out, so a recipe's fingerprint is what it was before them.
            "recipe": self.recipe.model_dump(mode="json", exclude=None if self.recipe.secrets else {"secrets"}),
            # short_name only names recipes (recipe_names.py): a run's fingerprint stays what runs.
            "model": {"name": self.recipe.model, **self.model.model_dump(mode="json", exclude={"short_name"})},
        }

    def sources(self) -> dict[str, str]:
        """Every leaf of the resolved recipe -> where its value came from (recipe.lock.yaml)."""
        out = {}
        for key in _leaves(self.recipe.model_dump(mode="json")):
            out[key] = _source_of(self.provenance, key) or "default"
        return out

    @property
    def fingerprint(self) -> str:
        locked = self.locked()
        # What the cluster charges is not what runs: the prices (recorded in the lock, read for each
        # point's cost) stay out of the fingerprint, so a price change keeps a recipe's runs together.
        for key in ("gpu_hour_usd", "kwh_usd"):
            locked["recipe"].get("site", {}).pop(key, None)
        canonical = json.dumps(locked, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    try:
        return yaml_bounded.safe_load(text)
    except yaml_bounded.ExpansionError as e:
        raise ConfigError(path, "", f"refused: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        raise ConfigError(path, "", f"{line}invalid YAML ({getattr(e, 'problem', e)})") from None


def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1, 'c': [2]}} -> {'a.b': 1, 'a.c': [2]}; an empty mapping is a leaf."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data} if prefix else {}


def _source_of(provenance: dict[str, str], key: str) -> str | None:
    """The source of `key`: its own, else its nearest parent's (a whole mapping set at once)."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        src = provenance.get(".".join(parts[:i]))
        if src is not None:
            return src
    return None


def _owner(provenance: dict[str, str], key: str) -> tuple[str, str] | None:
    """(the key a layer set, that layer) for `key`: itself or its nearest parent; for a section,
    the last key written into it."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        k = ".".join(parts[:i])
        if k in provenance:
            return k, provenance[k]
    under = [(k, v) for k, v in provenance.items() if k.startswith(key + ".")]
    return under[-1] if under else None


def source_of_key(provenance: dict[str, str], key: str) -> str | None:
    """Where `key` came from; for a section, the last layer that wrote into it."""
    owner = _owner(provenance, key)
    return owner[1] if owner else None


def blame(provenance: dict[str, str], key: str, files: dict[str, Path], default: Path | str) -> str:
    """The file (recipe or cluster profile) or `--set KEY` that gave the value at `key`."""
    owner = _owner(provenance, key)
    if owner is None:
        return str(default)
    set_key, label = owner
    return f"--set {set_key}" if label == "--set" else str(files.get(label, label))


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _record(provenance: dict[str, str], data: dict[str, Any], label: str) -> None:
    for key in _leaves(data):
        # A layer that sets a key replaces what earlier layers said below it.
        for old in [k for k in provenance if k.startswith(key + ".")]:
            del provenance[old]
        provenance.pop(key, None)  # kept in the order written: a section's last writer is last
        provenance[key] = label


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds: itself, or inside Optional, list[...] or dict[..., ...]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _keys_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys the model accepts where `loc` points (list indexes and mapping keys stepped over)."""
    current = model
    for part in loc:
        info = current.model_fields.get(str(part))
        if info is None:
            continue  # a list index or a mapping's own key
        inner = _model_of(info.annotation)
        if inner is None:
            return []
        current = inner
    return list(current.model_fields)


def _validation_error(
    model: type[BaseModel], path: Path | str, err: ValidationError, provenance=None, files=None
) -> ConfigError:
    first = err.errors()[0]
    loc = list(first["loc"])
    msg = first["msg"].removeprefix("Value error, ") if first["type"] == "value_error" else first["msg"]
    # A check across a section's keys says which key it is about ("proxy.workers: ...",
    # "slos.tight.ttft_p99.9: ..."): that key, whole, is the one to name, and its source the one
    # to blame. It is the message's first word, whatever its characters (digits, '.', '-').
    about = re.match(r"(\S+): ", msg) if first["type"] == "value_error" else None
    if about and about.group(1).split(".")[0] in _keys_at(model, loc):
        loc.append(about.group(1))
        msg = msg[about.end() :]
    key = ".".join(str(p) for p in loc)
    split = None
    if provenance:
        # Name what gave the offending value: the recipe, the cluster profile or `--set KEY`.
        path = blame(provenance, key, files or {}, path)
        split = _split_at_decimal(str(path), key, first.get("input"))
    if split is not None:
        key, msg = split
    elif first["type"] == "extra_forbidden":
        msg = "unknown key" + did_you_mean(str(first["loc"][-1]), _keys_at(model, first["loc"][:-1]))
    elif first["type"] == "missing":
        msg = "required key is missing"
    elif first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        msg = f"expected a mapping of keys (got {first.get('input')!r})"  # not pydantic's class names
    elif first["type"] == "value_error":
        pass  # our validators' messages say what was got
    elif "input" in first:
        msg = f"{msg} (got {first['input']!r})"
    more = len(err.errors()) - 1
    if more:
        msg += f" (and {more} more error{'s' if more > 1 else ''})"
    return ConfigError(path, key or "(top level)", msg)


def _split_at_decimal(source: str, key: str, given: Any) -> tuple[str, str] | None:
    """(the key meant, how to set it) when `--set ....ttft_p99.9=V` split a key with a decimal
    point at it: the loader then saw ttft_p99 holding {9: V}. None for any other error."""
    meant = source.removeprefix("--set ")
    digits = meant.removeprefix(key + ".")
    if meant == source or digits == meant or "." not in key or not key[-1].isdigit():
        return None
    if not digits.isdigit() or not isinstance(given, dict) or digits not in given:
        return None
    parent, leaf = key.rsplit(".", 1)
    value = json.dumps(given[digits])
    return meant, (
        f"--set splits a key at every '.', so {leaf}.{digits} became {leaf} holding {{{digits}: {value}}}; "
        f"give a key with a '.' in its mapping (the whole mapping): --set '{parent}={{{leaf}.{digits}: {value}}}'"
    )


def _validate(model: type[BaseModel], data: Any, path: Path, provenance=None, files=None) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(model, path, e, provenance, files) from None


def apply_overrides(
    data: dict[str, Any], overrides: Overrides, provenance: dict[str, str] | None = None
) -> dict[str, Any]:
    """Each override in order: `--set` and the options that set a recipe key (the lock's sources
    name the option)."""
    for o in records(overrides):
        parts = list(o.key)
        if provenance is not None:
            nested: Any = o.value
            for part in reversed(parts):
                nested = {part: nested}
            _record(provenance, nested, o.origin)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"--set {o.dotted}", where, "holds a value, not keys below it")
            node = child
        node[parts[-1]] = o.value
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
    overrides: Overrides | None = None,
    root: Path = PROJECT_ROOT,
    models_file: Path | None = None,
    cluster: str | None = None,
) -> ResolvedRecipe:
    """The recipe, merged with a cluster profile (by name or path) and --set overrides, in that order."""
    path = recipe_path(name_or_path, root)
    if not path.is_file():
        if (new := RENAMED.get(name_or_path)) is not None:
            raise ConfigError(
                path, "", f"recipe {name_or_path!r} was renamed to {new!r} (docs/recipes.md, recipe names)"
            )
        available = sorted(p.stem for p in (root / "recipes").glob("*.yaml"))
        hint = did_you_mean(name_or_path, available)
        raise ConfigError(path, "", f"recipe not found{hint} (available: {', '.join(available) or 'none'})")
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(path, "", "expected a mapping of recipe keys")
    provenance: dict[str, str] = {}
    files = {_label(path, root): path}  # label in provenance -> the path errors name
    _record(provenance, data, _label(path, root))
    cluster_file = None
    if cluster:
        cluster_file, profile = load_profile(cluster, root)
        model = data.get("model")
        overlay = profile.overlay(model if isinstance(model, str) else "")
        files[_label(cluster_file, root)] = cluster_file
        _record(provenance, overlay, _label(cluster_file, root))
        data = _deep_merge(data, overlay)
    data = apply_overrides(data, overrides or (), provenance)
    recipe: Recipe = _validate(Recipe, data, path, provenance=provenance, files=files)

    models_file = models_file or root / "models.yaml"
    catalogue = load_catalogue(models_file)
    if recipe.model not in catalogue.models:
        raise ConfigError(
            blame(provenance, "model", files, path),
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
    return ResolvedRecipe(
        name,
        recipe,
        catalogue.models[recipe.model],
        path.resolve(),
        models_file.resolve(),
        root,
        cluster_file.resolve() if cluster_file else None,
        provenance,
    )


def _label(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path.resolve())


def load_profile(name: str, root: Path = PROJECT_ROOT) -> tuple[Path, ClusterProfile]:
    try:
        path = profile_path(name, root)
    except FileNotFoundError as e:
        raise ConfigError("--cluster", name, str(e)) from None
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(path, "", "expected a mapping of cluster profile keys")
    return path, _validate(ClusterProfile, data, path)
