"""Which format `pdbench report` writes: `--format`, else `--out`'s extension, else a table for a
terminal and markdown for a pipe; never HTML to a terminal."""

from __future__ import annotations

from enum import Enum
from pathlib import Path


class Format(str, Enum):
    text = "text"  # rich tables at the terminal's width
    md = "md"
    csv = "csv"
    html = "html"
    json = "json"


EXTENSIONS = {
    ".txt": Format.text,
    ".md": Format.md,
    ".markdown": Format.md,
    ".csv": Format.csv,
    ".html": Format.html,
    ".htm": Format.html,
    ".json": Format.json,
}


class FormatError(ValueError):
    pass


def choose(fmt: Format | None, out: Path | None, terminal: bool) -> Format:
    """The format to write; `terminal`: stdout is one (and there is no --out)."""
    known = ", ".join(EXTENSIONS)
    if out is not None:
        by_name = EXTENSIONS.get(out.suffix.lower())
        if fmt is None:
            if by_name is None:
                raise FormatError(
                    f"--out {out}: no format for the extension {out.suffix or '(none)'!r}; "
                    f"use one of {known}, or pass --format"
                )
            return by_name
        if by_name is not None and by_name is not fmt:
            raise FormatError(
                f"--out {out} names a {by_name.value} file but --format is {fmt.value}; "
                "drop --format (the extension decides) or make them agree"
            )
        return fmt
    if fmt is None:
        return Format.text if terminal else Format.md
    if fmt is Format.html and terminal:
        raise FormatError(
            "--format html: not written to a terminal; write it to a file (--out report.html) and open that"
        )
    return fmt
