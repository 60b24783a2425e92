"""The recipe-name grammar (docs/recipes.md): a file in recipes/ is named
<model>-<precision>-<hardware>-<connector>-<topology>[-<variant>], each token what the file says,
so that a name can be trusted without opening the file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.hardware import VENDORS, evidence, vendor_of
from harness.config.load import ConfigError, ResolvedRecipe, load_catalogue
from harness.config.schema import ModelSpec

GRAMMAR = "<model>-<precision>-<hardware>-<connector>-<PpDd|agg>[-<variant>]"
FULL_NODE = 8  # a bare accelerator token means whole nodes of this many GPUs
NO_CONNECTOR = "none"  # the connector token of an aggregated-only recipe: no KV connector runs
_VARIANT = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
_HARDWARE = re.compile(r"(?P<accel>[a-z0-9]+?)(x(?P<gpus>[0-9]+))?")
_TOPOLOGY = re.compile(r"(?P<p>[1-9][0-9]*)p(?P<d>[1-9][0-9]*)d|agg")


@dataclass(frozen=True)
class Facts:
    """What a recipe file says about the tokens of its name (before a cluster profile or --set)."""

    model_key: str
    model: ModelSpec
    connector: str
    prefill_workers: int
    decode_workers: int
    aggregated_only: bool
    gpus_per_node: int | None  # None: the file leaves it to the cluster profile
    hardware: tuple[tuple[str, str, str], ...]  # (key, value, vendor) of the file's image, gpus, ...


def _int(values: dict[str, Any], key: str, default: int | None) -> int | None:
    value = values.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def facts_of(rr: ResolvedRecipe) -> Facts:
    """The recipe file's own values: a name describes the file, not one invocation's --set."""
    own = rr.file_values()
    model_key = own.get("model")
    model_key = model_key if isinstance(model_key, str) else rr.recipe.model
    return Facts(
        model_key=model_key,
        model=load_catalogue(rr.models_file).models.get(model_key, rr.model),
        connector=str(own.get("connector.name", rr.recipe.connector.name)),
        prefill_workers=_int(own, "topology.prefill.workers", 1) or 1,
        decode_workers=_int(own, "topology.decode.workers", 1) or 1,
        aggregated_only=own.get("topology.aggregated_only") is True,
        gpus_per_node=_int(own, "topology.gpus_per_node", None),
        hardware=tuple(evidence(own)),
    )


def _hardware_token(gpus: int, accel: str) -> str:
    return "cpu" if gpus == 0 else accel if gpus == FULL_NODE else f"{accel}x{gpus}"


def _hardware_problem(token: str, facts: Facts) -> str | None:
    m = _HARDWARE.fullmatch(token)
    vendor = vendor_of(m["accel"]) if m else None
    if m is None or vendor is None or (vendor == "cpu" and m["gpus"]):
        return f"{token!r} names no GPU known to harness/config/hardware.py, nor cpu"
    gpus = 0 if vendor == "cpu" else int(m["gpus"]) if m["gpus"] else FULL_NODE
    if m["gpus"] and not 0 < gpus < FULL_NODE:
        return f"{token!r}: x<N> is 1 to {FULL_NODE - 1} GPUs of a node; whole nodes are {m['accel']!r}"
    if facts.gpus_per_node is not None and facts.gpus_per_node != gpus:
        want = _hardware_token(facts.gpus_per_node, m["accel"] if vendor != "cpu" else "<gpu>")
        return f"{token!r} is {gpus} GPU(s) per node, but topology.gpus_per_node is {facts.gpus_per_node} ({want!r})"
    other = [(key, value, v) for key, value, v in facts.hardware if v != vendor]
    if other:
        key, value, v = other[0]
        return f"{token!r} is {VENDORS[vendor]}, but {key} {value} is {VENDORS[v]}"
    return None


def name_problem(name: str, facts: Facts) -> str | None:
    """The first token of `name` that breaks the grammar or disagrees with the file ('token: why'),
    or None when the name is right."""
    short = facts.model.short_name
    if short is None:
        return f"model: models.yaml's {facts.model_key!r} has no short_name, the model token of recipe names"
    if not name.startswith(f"{short}-"):
        return f"model: expected {short!r} (the short_name of {facts.model_key!r} in models.yaml) first"
    tokens = name[len(short) + 1 :].split("-")
    if len(tokens) < 4:
        return f"tokens: {name!r} has {len(tokens) + 1} of the 5 required"
    precision, hardware, connector, topology, *variant = tokens
    if precision != facts.model.precision:
        return f"precision: {precision!r}, but models.yaml gives {facts.model_key!r} {facts.model.precision!r}"
    if (problem := _hardware_problem(hardware, facts)) is not None:
        return f"hardware: {problem}"
    want = NO_CONNECTOR if facts.aggregated_only else facts.connector
    if connector != want:
        why = "an aggregated-only recipe runs no KV connector" if facts.aggregated_only else "its connector.name"
        return f"connector: {connector!r}, expected {want!r} ({why})"
    m = _TOPOLOGY.fullmatch(topology)
    if m is None:
        return f"topology: {topology!r} is neither <P>p<D>d (e.g. 1p2d) nor agg"
    if facts.aggregated_only != (topology == "agg"):
        said = "aggregated-only" if facts.aggregated_only else "not aggregated-only"
        return f"topology: {topology!r}, but the recipe is {said} (topology.aggregated_only)"
    if m["p"] and (int(m["p"]), int(m["d"])) != (facts.prefill_workers, facts.decode_workers):
        return (
            f"topology: {topology!r}, but the recipe has {facts.prefill_workers} prefill and "
            f"{facts.decode_workers} decode worker(s) ({facts.prefill_workers}p{facts.decode_workers}d)"
        )
    if variant and not _VARIANT.fullmatch("-".join(variant)):
        return f"variant: {'-'.join(variant)!r} is not lower-case letters and digits joined by '-'"
    return None


def check_recipe_name(rr: ResolvedRecipe) -> None:
    """Refuse a recipe of the project's recipes/ whose file name breaks the grammar. A recipe file
    kept elsewhere (a user's own, a test's) is not the catalogue and is not checked."""
    path = Path(rr.recipe_file)
    if path.parent.resolve() != (rr.root / "recipes").resolve():
        return
    problem = name_problem(path.stem, facts_of(rr))
    if problem is not None:
        raise ConfigError(
            path, "", f"the file name breaks the recipe-name grammar: {problem}; expected {GRAMMAR} (docs/recipes.md)"
        )
