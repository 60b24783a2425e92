"""`pdbench recipes`: the recipes and cluster profiles there are to name, each with its description.

Files are read as YAML only (not checked against the schema: `pdbench validate` does that), so one
broken file is listed with what is wrong with it instead of hiding the others.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.config import yaml_bounded
from harness.config.cluster import DIR_ENV_VAR, ENV_VAR


@dataclass(frozen=True)
class Entry:
    name: str
    path: str
    description: str
    model: str | None = None  # recipes only


def _describe(path: Path) -> tuple[str, str | None]:
    try:
        data = yaml_bounded.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        return f"(unreadable: {type(e).__name__.replace('Error', ' error').strip()})", None
    if not isinstance(data, dict):
        return "(not a mapping of keys)", None
    model = data.get("model")
    return str(data.get("description") or "(no description)"), model if isinstance(model, str) else None


def recipes(root: Path) -> list[Entry]:
    out = []
    for path in sorted((root / "recipes").glob("*.yaml"), key=lambda p: p.stem):
        description, model = _describe(path)
        out.append(Entry(path.stem, str(path), description, model))
    return out


def profile_dirs(root: Path) -> list[Path]:
    """Where `--cluster NAME` looks, first match wins (harness.config.cluster's search order)."""
    dirs = [Path(os.environ[DIR_ENV_VAR])] if os.environ.get(DIR_ENV_VAR) else []
    return [*dirs, Path.home() / ".config" / "pdbench" / "clusters", root / "clusters"]


def profiles(root: Path) -> list[Entry]:
    """Each profile NAME once: the file `--cluster NAME` would read."""
    found: dict[str, Entry] = {}
    for directory in profile_dirs(root):
        for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
            if path.stem not in found:
                found[path.stem] = Entry(path.stem, str(path), _describe(path)[0])
    return sorted(found.values(), key=lambda e: e.name)


def listing(root: Path) -> dict[str, Any]:
    return {
        "recipes": [asdict(e) for e in recipes(root)],
        "cluster_profiles": [{k: v for k, v in asdict(e).items() if k != "model"} for e in profiles(root)],
        "profile_search_order": [str(d) for d in profile_dirs(root)],
        "default_profile": os.environ.get(ENV_VAR) or None,
    }


def listing_lines(root: Path, width: int | None) -> list[str]:
    """A name, then its description: wrapped to a terminal of `width` columns, or one line each (None)."""
    data = listing(root)

    def rows(entries: list[dict[str, Any]]) -> list[str]:
        pad = max((len(e["name"]) for e in entries), default=0) + 2
        room = max(width - pad - 2, 20) if width else 1 << 20
        out = []
        for e in entries:
            first, *rest = textwrap.wrap(e["description"], room) or [""]
            out += [f"  {e['name']:<{pad}}{first}", *(" " * (pad + 2) + line for line in rest)]
        return out or ["  (none)"]

    lines = ["Recipes (pdbench validate|submit NAME):", *rows(data["recipes"]), ""]
    lines.append("Cluster profiles (--cluster NAME):")
    lines += rows(data["cluster_profiles"])
    lines.append(f"  searched in: {', '.join(data['profile_search_order'])}")
    if data["default_profile"]:
        lines.append(f"  default: {data['default_profile']} (${ENV_VAR})")
    return lines
