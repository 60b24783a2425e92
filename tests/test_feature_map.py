"""docs/architecture.md's feature table says which files make up each feature. Each row names a
marker (a regular expression of the feature's own identifiers); the files listed must be exactly
the code files that carry it, so a file that starts or stops taking part in a feature, or moves,
fails here until the table says so."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The code a feature can live in: the harness, the bundled connector, the job templates.
CODE_DIRS = ("harness", "connector", "slurm_templates")
# | feature | what | `marker` | `file` `file` ... |; a '|' of the marker is written '\\|' in the table.
_ROW = re.compile(r"^\| (?P<feature>[^|]+?) \| [^|]+ \| `(?P<marker>[^`]+)` \| (?P<files>[^|]+) \|$")


def _rows() -> list[tuple[str, str, list[str]]]:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## Features and their files", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if m := _ROW.match(line):
            rows.append((m["feature"], m["marker"].replace("\\|", "|"), re.findall(r"`([^`]+)`", m["files"])))
    return rows


def _code() -> dict[str, str]:
    out = {}
    for top in CODE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".j2", ".sh"):
                out[str(path.relative_to(ROOT))] = path.read_text(errors="replace")
    return out


def test_the_table_has_the_features() -> None:
    rows = _rows()
    assert len(rows) >= 12, rows  # the section was found and read
    assert len({feature for feature, _, _ in rows}) == len(rows)


def test_each_feature_lists_exactly_the_files_that_carry_its_marker() -> None:
    code = _code()
    problems = []
    for feature, marker, files in _rows():
        pattern = re.compile(marker)
        carrying = {path for path, text in code.items() if pattern.search(text)}
        listed = set(files)
        if len(carrying) < 2:
            problems.append(f"{feature}: `{marker}` is in {sorted(carrying)}: a marker that finds the feature")
        if missing := sorted(listed - set(code)):
            problems.append(f"{feature}: listed but not a code file: {missing}")
        if stale := sorted((listed & set(code)) - carrying):
            problems.append(f"{feature}: listed but no longer carrying `{marker}`: {stale}")
        if unlisted := sorted(carrying - listed):
            problems.append(f"{feature}: carry `{marker}` but are not listed: {unlisted}")
    assert not problems, "docs/architecture.md, Features and their files:\n" + "\n".join(problems)
