"""A recipe override as a record: the key path, its value and the option that gave it.

`--set KEY=VALUE` is parsed here once (the value as YAML, so numbers and lists keep their type);
a typed command-line option (`--time`, `--partition`, ...) builds its record directly, with its
value as Typer parsed it. The loader applies records in order and names each one's origin in
the lock file's sources and in its errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from harness.config import yaml_bounded
from harness.config.errors import ConfigError

SET = "--set"


@dataclass(frozen=True)
class Override:
    key: tuple[str, ...]  # the dotted path, split: ("slurm", "time_limit")
    value: Any
    origin: str = SET  # the option that gave it, as the user wrote it: "--set", "--time", ...

    @classmethod
    def of(cls, dotted: str, value: Any, origin: str) -> Override:
        """The record of a typed option that sets the recipe key `dotted`."""
        return cls(tuple(dotted.split(".")), value, origin)

    @property
    def dotted(self) -> str:
        return ".".join(self.key)


# What a caller may pass the loader: records, or `--set` texts (a search file's `set:`, a test's)
# that are parsed into records there.
Overrides = Sequence[Override | str]


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a','b','c'], value parsed as YAML so numbers and lists keep their type)."""
    if "=" not in text:
        raise ConfigError(f"--set {text}", "", "expected KEY.PATH=VALUE, e.g. benchmark.isl=1024")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {key}", "", "expected a dotted key path such as benchmark.isl")
    try:
        value = yaml_bounded.safe_load(raw) if raw.strip() else ""
    except yaml_bounded.ExpansionError as e:
        raise ConfigError(f"--set {key}", "", f"refused: {e}") from None
    except yaml.YAMLError:
        value = raw
    return parts, value


def parse_set(text: str) -> Override:
    """One `--set KEY=VALUE` as its record; a ConfigError naming `--set KEY` when it is malformed."""
    parts, value = parse_override(text)
    return Override(tuple(parts), value)


def records(given: Iterable[Override | str]) -> list[Override]:
    """Records as they are; a `--set` text parsed into its record."""
    return [o if isinstance(o, Override) else parse_set(o) for o in given]
