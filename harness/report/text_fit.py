"""Terminal tables that fit the width without breaking a word.

A table that fits is shown as it is. One that does not is folded, in this order, because each
step loses less than the next: (1) the identifying columns (Serving, ISL, OSL, ...) that hold one
value on every row leave the table for a line above it; (2) the other columns are split across
tables that each repeat the identifying ones, so every row still reads as one point. Rich would
otherwise drop the columns that do not fit, or break words and numbers letter by letter.
"""

from __future__ import annotations

import io
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# Headers that name a point rather than measure it: repeated in each part of a split table.
ID_HEADERS = frozenset({"Run", "Serving", "ISL", "OSL", "ISL/OSL", "Conc", "Turn", "At"})


def table(headers: list[str], numeric: list[bool]) -> Table:
    """Headers wrap at their spaces; `add_rows` keeps numbers whole."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for h, num in zip(headers, numeric, strict=True):
        t.add_column(h, justify="right" if num else "left", overflow="fold")
    return t


def add_rows(t: Table, rows: list[list[Any]]) -> Table:
    """Add the rows; a column is never narrower than its widest short cell (a number, a run key,
    a shape) or a header's longest word, so neither is folded when the table is narrowed to fit."""
    for i, col in enumerate(t.columns):
        short = [len(line) for r in rows for line in str(r[i]).splitlines() if len(line) <= 12]
        short += [len(word) for word in str(col.header).split()]  # nor a header's word
        col.min_width = max(short, default=None)
    for r in rows:
        t.add_row(*r)
    return t


def _width_needed(t: Table) -> int:
    """The narrowest the table can be with no word broken (rich's minimum: each column's longest word)."""
    console = Console(file=io.StringIO(), width=10_000)
    return Measurement.get(console, console.options, t).minimum


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def fit(headers: list[str], numeric: list[bool], rows: list[list[Any]], width: int) -> list[RenderableType]:
    """The table, or its folded form (see the module's docstring), no wider than `width`."""
    whole = add_rows(table(headers, numeric), rows)
    if not rows or _width_needed(whole) <= width:
        return [whole]
    ids = 0
    while ids < len(headers) and headers[ids] in ID_HEADERS:
        ids += 1
    # (1) One value on every row: say it once. The run column stays (it names the row).
    same = [i for i in range(ids) if headers[i] != "Run" and len({_plain(r[i]) for r in rows}) == 1]
    out: list[RenderableType] = []
    if same:
        out.append(Text("All rows: " + ", ".join(f"{headers[i]} {_plain(rows[0][i])}" for i in same), style="dim"))
    keep = [i for i in range(ids) if i not in same]
    # (2) The other columns in as few parts as fit, each part with the identifying columns.
    parts: list[list[int]] = []
    for i in range(ids, len(headers)):
        trial = [*parts[-1], i] if parts else [i]
        cols = keep + trial
        narrow = add_rows(table([headers[c] for c in cols], [numeric[c] for c in cols]), _pick(rows, cols))
        if parts and _width_needed(narrow) > width:
            parts.append([i])
        elif parts:
            parts[-1] = trial
        else:
            parts.append(trial)
    for n, part in enumerate(parts):
        cols = keep + part
        if n:
            out.append(Text(""))
        out.append(add_rows(table([headers[c] for c in cols], [numeric[c] for c in cols]), _pick(rows, cols)))
    return out


def _pick(rows: list[list[Any]], cols: list[int]) -> list[list[Any]]:
    return [[r[c] for c in cols] for r in rows]
