"""Reading the TOML a person writes — matrix and study files, ``warehouse.toml``,
``framework.toml`` — with every syntax error naming a line.

:func:`loads` is ``tomllib.loads`` with two differences.  A value left open at the end of
the file (an array, an inline table, a string, a table header), which ``tomllib`` reports
only as ``(at end of document)``, is named by the line and column where it opened, found
by a scan of the text (:func:`unclosed`); when nothing is open, the error names the line and
column where the document ends.  And nesting deep enough to exhaust ``tomllib``'s recursion
is a :class:`TomlTooDeep` error instead of a ``RecursionError``.

Standard library only: every layer above ``matrun.errors`` may use it.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any, NamedTuple

#: How ``tomllib`` ends the message of an error it met at the end of the text.
AT_END = " (at end of document)"

# What the scan stops at outside strings and comments: a line's end, a string's quote, a
# comment, a bracket or a brace.
_SPECIAL = re.compile(r"[\n\"'#\[\]{}]")
# Inside a basic string ("…" or """…"""): its end, an escape, a line's end.
_BASIC_STOP = re.compile(r"[\"\\\n]")


class TomlError(ValueError):
    """Text that is not valid TOML; the message is ``tomllib``'s, with a line and column."""


class TomlTooDeep(TomlError):
    """Arrays or inline tables nested deeper than ``tomllib`` can recurse."""


class Opening(NamedTuple):
    """A value the text leaves open: what it is and where it opened (1-based)."""

    kind: str  # "array", "inline table", "string", "multi-line string", "table header"
    line: int
    column: int


def loads(text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``; a syntax error raises :class:`TomlError` naming where it is."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlError(located(str(exc), text)) from None
    except RecursionError:  # tomllib recurses once per level of nested arrays / inline tables
        raise TomlTooDeep("arrays or inline tables nested too deep to read") from None


def located(message: str, text: str) -> str:
    """``tomllib``'s ``message`` about ``text``, with ``(at end of document)`` replaced by the
    place of the value left open, or else by the line and column of the document's end."""
    if not message.endswith(AT_END):
        return message
    head = message[: -len(AT_END)]
    opening = unclosed(text)
    if opening is None:
        line, column = position(text, len(text))
        return f"{head} (at end of document, line {line}, column {column})"
    return (f"{head} (at end of document: the {opening.kind} opened at line {opening.line}, "
            f"column {opening.column} is not closed)")


def position(text: str, index: int) -> tuple[int, int]:
    """The line and column of ``text[index]`` as ``tomllib`` counts them (both from 1)."""
    line = text.count("\n", 0, index) + 1
    column = index - text.rfind("\n", 0, index)  # rfind gives -1 on the first line: index + 1
    return line, column


def unclosed(text: str) -> Opening | None:
    """The innermost value ``text`` leaves open, or None.

    The scan follows TOML's lexical structure only: comments, the four kinds of strings
    (escapes in basic ones, up to two quotes ending a multi-line one), table headers (a ``[``
    that starts a line outside any value) and the brackets and braces of arrays and inline
    tables.  It stops at the end of the text, or at the end of a line inside a one-line
    string or a table header, which ``tomllib`` reads as the same unclosed value.
    """
    stack: list[tuple[str, int]] = []
    index = 0
    line_start = 0  # where the current line began: a "[" with only blanks before it, outside values, is a header
    while True:
        found = _SPECIAL.search(text, index)
        if found is None:
            break
        at = found.start()
        char = text[at]
        if char == "\n":
            if stack and stack[-1][0] == "table header":
                break  # a header ends with its line
            line_start, index = at + 1, at + 1
            continue
        if char == "#":
            newline = text.find("\n", at)
            if newline < 0:
                break
            index = newline
            continue
        if char in "\"'":
            closed = _string_end(text, at)
            if closed is None:
                kind = "multi-line string" if text.startswith(char * 3, at) else "string"
                return _opening(text, kind, at)
            index = closed
            continue
        if char == "[":
            if not stack and not text[line_start:at].strip(" \t\r"):
                stack.append(("table header", at))
                index = at + (2 if text.startswith("[[", at) else 1)
            else:
                stack.append(("array", at))
                index = at + 1
            continue
        if char == "{":
            stack.append(("inline table", at))
            index = at + 1
            continue
        # "]" or "}": closes the innermost value (a header's "]]" at once)
        if stack:
            kind, opened = stack.pop()
            if kind == "table header" and text.startswith("[[", opened) and text.startswith("]]", at):
                at += 1
        index = at + 1
    if not stack:
        return None
    kind, opened = stack[-1]
    return _opening(text, kind, opened)


def _opening(text: str, kind: str, index: int) -> Opening:
    line, column = position(text, index)
    return Opening(kind, line, column)


def _string_end(text: str, start: int) -> int | None:
    """The index just after the string opening at ``start``, or None when it is not closed
    (the text ends first, or, for a one-line string, its line)."""
    quote = text[start]
    multi = text.startswith(quote * 3, start)
    index = start + (3 if multi else 1)
    if quote == "'":  # literal: no escapes
        if multi:
            close = text.find("'''", index)
            return None if close < 0 else _past_quotes(text, close, "'")
        close = text.find("'", index)
        newline = text.find("\n", index)
        return None if close < 0 or 0 <= newline < close else close + 1
    while True:  # basic: backslash escapes
        found = _BASIC_STOP.search(text, index)
        if found is None:
            return None
        at = found.start()
        char = text[at]
        if char == "\\":
            index = at + 2
        elif char == "\n":
            if not multi:
                return None
            index = at + 1
        elif not multi:
            return at + 1
        elif text.startswith('"""', at):
            return _past_quotes(text, at, '"')
        else:
            index = at + 1


def _past_quotes(text: str, close: int, quote: str) -> int:
    """After a multi-line string's closing three quotes at ``close``: up to two more quotes
    belong to the string's content (``'''a''''`` is ``a'``)."""
    index = close + 3
    extra = 0
    while extra < 2 and text.startswith(quote, index):
        index += 1
        extra += 1
    return index
