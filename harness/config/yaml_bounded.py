"""YAML read with its alias expansion bounded.

PyYAML's safe loader builds an alias as a second reference to its anchor's object, so a small file
of nested aliases (a "billion laughs") loads at once into a graph whose expanded tree has billions
of nodes, and whatever walks it later (validation, the lock file, the fingerprint) runs out of
memory after minutes. Here the composed document's expanded size is counted before anything is
built from it (each node once, however many aliases reach it) and a document over MAX_NODES, or
with an alias inside its own anchor, is refused. A recipe has hundreds of nodes."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_NODES = 100_000


class ExpansionError(yaml.YAMLError):
    """The document expands (through its aliases) past the bound, or into itself."""


class _BoundedLoader(yaml.SafeLoader):
    def get_single_node(self) -> Node | None:
        node = super().get_single_node()
        if node is not None:
            size = _expanded(node, {}, set())
            if size > MAX_NODES:
                raise ExpansionError(
                    f"its aliases expand it to {size:,} nodes, over the bound of {MAX_NODES:,} (an alias bomb?)"
                )
        return node


def _expanded(node: Node, memo: dict[int, int], active: set[int]) -> int:
    """Nodes in `node`'s tree with every alias expanded; each distinct node is visited once."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in active:
        raise ExpansionError("an alias refers to a node that contains it (a recursive alias)")
    active.add(key)
    if isinstance(node, MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, SequenceNode):
        children = node.value
    else:
        children = []
    total = 1
    for child in children:
        total += _expanded(child, memo, active)
    active.discard(key)
    memo[key] = total
    return total


def safe_load(text: str) -> Any:
    """yaml.safe_load, refusing a document that expands past MAX_NODES (ExpansionError) or nests
    deeper than Python's recursion allows (ExpansionError too)."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader subclass
    except RecursionError:
        raise ExpansionError("nested too deeply") from None
