"""Terminal tables that fit the width without splitting a word inside a cell.

rich shrinks every column of a table that is too wide, down to cutting words in
half ("3283" / "1"). Here each column says how important it is and whether its
text may wrap between words; `fit_table` then drops the least important columns
until the rest fit at their minimum width (the longest word of a prose column,
the whole value of any other), a column that is empty in every row going first,
then narrows the widest columns to fit, and names the columns it left out. Only
when even the required columns do not fit at their minimum does a prose column
fold inside a word. Every table of `report`, `diff` and `check` goes through
it, so a new column only has to declare its priority.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

# Columns are dropped highest number first; REQUIRED ones are never dropped.
REQUIRED = 0
MIN_FOLDED = 8             # a prose column folded inside its words keeps this many cells
DEFAULT_PIPE_WIDTH = 160   # stdout is not a terminal and COLUMNS is unset (CI logs, pipes)


@dataclass(frozen=True)
class Column:
    """One table column: its header and how it behaves when the width is short."""

    header: str
    priority: int = REQUIRED     # higher numbers are left out first when the width is short
    justify: str = "left"
    wrap: bool = False           # prose: may wrap between words (never inside one)
    want: int = 0                # prose: optional columns are left out before this one
                                 # narrows below `want` (a message needs room to be read)


def console_width(stream: Any) -> int | None:
    """The width to render at: the terminal's (rich finds it), else COLUMNS, else 160."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if stream.isatty():
            return None
    except (AttributeError, ValueError):
        pass
    return DEFAULT_PIPE_WIDTH


def make_console(stderr: bool = False) -> Any:
    """A rich console on stdout (or stderr) at `console_width`."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=console_width(stream), highlight=False)


def _plain(cell: str) -> str:
    from rich.text import Text

    return Text.from_markup(cell).plain if "[" in cell else cell


def _longest_word(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(word) for word in text.split()), default=0)


def _widest_line(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.splitlines()), default=0)


def _table_width(widths: list[int]) -> int:
    """Rendered width of a show_edge=False table: 1 cell of padding each side, 1 rule between."""
    return sum(widths) + 3 * len(widths) - 1 if widths else 0


def fit_columns(columns: list[Column], rows: list[list[str]], width: int
                ) -> tuple[list[int], dict[int, int]]:
    """Which columns to show at `width` and how wide: (dropped indexes, {index: width})."""
    plain = [[_plain(c) for c in row] for row in rows]
    natural, minimum = [], []
    for i, col in enumerate(columns):
        cells = [row[i] for row in plain]
        widest = max([_widest_line(c) for c in cells] + [1])
        header_word = _longest_word(col.header)
        # natural: every cell and the header on one line; minimum: headers wrap between
        # words, prose cells too, any other cell keeps its whole value on one line
        natural.append(max(widest, _widest_line(col.header)))
        body = max([_longest_word(c) for c in cells] + [1]) if col.wrap else widest
        minimum.append(max(body, header_word))
    # a column that says nothing in any row (all "-" or blank) is the first to go
    empty = [all(row[i].strip() in ("", "-") for row in plain) for i in range(len(columns))]
    shown = list(range(len(columns)))

    def total(ws: dict[int, int] | list[int]) -> int:
        return _table_width([ws[i] for i in shown])

    dropped: list[int] = []
    while True:
        widths = _shrink({i: natural[i] for i in shown}, minimum, width, total)
        squeezed = total(widths) > width or any(
            columns[i].want and widths[i] < min(columns[i].want, natural[i]) for i in shown)
        candidates = [i for i in shown if columns[i].priority > REQUIRED]
        if not squeezed or not candidates:
            break
        worst = max(candidates, key=lambda i: (empty[i], columns[i].priority, i))
        shown.remove(worst)
        dropped.append(worst)
    # even the columns left do not fit whole: the prose ones fold inside their words,
    # never an id or a number (rich, left to it, cuts every column alike)
    folded = [min(m, max(MIN_FOLDED, _longest_word(col.header))) if col.wrap else m
              for col, m in zip(columns, minimum, strict=True)]
    widths = _shrink(widths, folded, width, total)
    return sorted(dropped), widths


def _shrink(widths: dict[int, int], minimum: list[int], width: int, total: Any) -> dict[int, int]:
    """Narrow the widest column that still can, one cell at a time, until the table fits."""
    excess = total(widths) - width
    while excess > 0:
        room = [i for i in widths if widths[i] > minimum[i]]
        if not room:
            break  # even the required columns do not fit: rich folds as a last resort
        widest = max(room, key=lambda i: (widths[i], i))
        widths[widest] -= 1
        excess -= 1
    return widths


def fit_table(console: Any, columns: list[Column], rows: list[list[str]], *,
              title: str | None = None) -> tuple[Any, list[str]]:
    """A rich Table of `rows` that fits `console.width`, and the headers it left out
    that had something to show."""
    from rich.table import Table

    dropped, widths = fit_columns(columns, rows, console.width)
    table = Table(title=title, title_justify="left", show_edge=False)
    shown = [i for i in range(len(columns)) if i not in dropped]
    for i in shown:
        col = columns[i]
        table.add_column(col.header, justify=col.justify, width=widths[i], overflow="fold")
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    # a column left out that was empty in every row lost nothing: not worth a mention
    said = [i for i in dropped if any(_plain(row[i]).strip() not in ("", "-") for row in rows)]
    return table, [columns[i].header for i in said]


def print_table(console: Any, columns: list[Column], rows: list[list[str]], *,
                title: str | None = None) -> None:
    """Print a fitted table, then one line naming the columns left out (if any)."""
    table, dropped = fit_table(console, columns, rows, title=title)
    console.print(table)
    if dropped:
        console.print(f"(not shown at {console.width} columns: {', '.join(dropped)}; "
                      "see --json)", highlight=False)


def print_line(console: Any, markup: str, hang: int = 2) -> None:
    """Print one line of prose (rich markup) that fits `console.width`: wrapped between
    words, each continuation indented `hang` cells past the line's own indent, so a
    wrapped line never starts at column 0 or reads as a new item."""
    from rich.text import Text

    text = Text.from_markup(markup)
    body = text.plain.lstrip(" ")
    lead = len(text.plain) - len(body)
    text = text[lead:]
    width = max(console.width - lead - hang, 20)
    for i, line in enumerate(text.wrap(console, width, overflow="fold")):
        line.rstrip()
        pad = " " * (lead if i == 0 else lead + hang)
        console.print(Text(pad) + line, highlight=False, soft_wrap=True)
