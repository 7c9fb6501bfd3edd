"""How ``matrun query`` lays a result out for a person (docs/CLI.md "matrun query").

On a terminal a table gets the columns that fit its width whole, as DuckDB's own command line
does: when they do not all fit, the first and the last columns are kept, taken from both ends
in turn, and one ``…`` column stands for the columns hidden in the middle (:func:`fit_columns`),
which a note counts.  Piped, or with ``--wide``, every column is shown at its full width.
``--format vertical`` writes each row as one ``column │ value`` line per column
(:func:`vertical_lines`), for a few rows of many columns.

Pure: widths in, choices out; the command (``results.py``) prints.
"""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len

#: What stands for the hidden columns, in the header and in every row.
HIDDEN = "…"
#: A column wider than this counts as this wide when the columns to show are chosen: on a
#: terminal its text is folded onto more lines rather than hide the columns beside it.
FOLD_WIDTH = 40


def table_width(widths: Sequence[int]) -> int:
    """The width of a table whose columns' contents are ``widths`` wide, as rich draws it:
    a border before each column and after the last, a space of padding on either side."""
    return sum(widths) + 3 * len(widths) + 1


def column_widths(names: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's width in terminal cells: its widest line of text, its name included."""
    widths = [_text_width(name) for name in names]
    for row in rows:
        for index, text in enumerate(row):
            widths[index] = max(widths[index], _text_width(text))
    return widths


def _text_width(text: str) -> int:
    return max(map(cell_len, text.split("\n"))) if "\n" in text else cell_len(text)


def fit_columns(widths: Sequence[int], width: int) -> list[int | None]:
    """The columns to show in a terminal ``width`` cells wide: every index when they fit,
    else the first and the last, taken from both ends in turn (the first column always),
    with ``None`` where the hidden ones stand.  A column counts at most ``FOLD_WIDTH`` wide."""
    budget = [min(w, FOLD_WIDTH) for w in widths]
    if table_width(budget) <= width:
        return list(range(len(widths)))
    left: list[int] = []
    right: list[int] = []
    used = table_width([len(HIDDEN)])  # the edges and the hidden columns' column
    low, high = 0, len(widths) - 1
    while low <= high:
        from_left = len(left) <= len(right)
        index = low if from_left else high
        if used + budget[index] + 3 > width and left:
            break
        used += budget[index] + 3
        if from_left:
            left.append(index)
            low += 1
        else:
            right.insert(0, index)
            high -= 1
    return [*left, None, *right] if low <= high else [*left, *right]


def hidden_note(shown: Sequence[int | None], total: int) -> str:
    """The line under a table whose middle columns are hidden."""
    hidden = total - sum(1 for index in shown if index is not None)
    return (f"{hidden} of {total} columns hidden at {HIDDEN}: --wide shows every column, --format vertical "
            "one per line")


def vertical_lines(names: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Each row as a ``── row N ──`` line, then ``name │ value`` for each column (names padded
    to the longest; a value's further lines under its first), a blank line between rows."""
    names = [name.replace("\n", " ") for name in names]
    pad = max((cell_len(name) for name in names), default=0)
    lines: list[str] = []
    for number, row in enumerate(rows, start=1):
        if number > 1:
            lines.append("")
        lines.append(f"── row {number} ──")
        for name, text in zip(names, row):
            first, *more = text.split("\n")
            lines.append(f"{name}{' ' * (pad - cell_len(name))} │ {first}")
            lines.extend(f"{' ' * pad} │ {line}" for line in more)
    return lines
