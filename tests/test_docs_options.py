"""Every option a document shows on a `pdbench COMMAND` line is one that command has: a new
user copies them (docs/search.md once showed `--dir` for `--search-dir`)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer

from harness.cli import app

ROOT = Path(__file__).resolve().parents[1]


def _doc_lines() -> list[tuple[str, str]]:
    """Each `pdbench COMMAND ...` line of a code block in README.md and docs/*.md."""
    found = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```[a-z]*\n(.*?)```", md.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip().removeprefix("$ ")
                if line.startswith("pdbench "):
                    found.append((md.relative_to(ROOT).as_posix(), line))
    return found


def test_documented_options_exist() -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    lines = _doc_lines()
    checked, wrong = 0, []
    for doc, line in lines:
        words = shlex.split(line)
        cmd = commands.get(words[1])
        if cmd is None:  # prose about pdbench in a diagram, not a command line
            continue
        options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for w in words[2:]:
            checked += w.startswith("--")
            if w.startswith("--") and w.split("=")[0] not in options:
                wrong.append(f"{doc}: `{line}`: {words[1]} has no option {w}")
    assert checked > 20, checked  # the documents do show options
    assert not wrong, "\n".join(wrong)
