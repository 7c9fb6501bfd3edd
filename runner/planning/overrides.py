"""``--set KEY=VALUE``: a cell parameter given on the command line (``plan``, ``sweep``,
``status``, ``cancel``; docs/MATRIX.md "Overrides").

``parse_overrides`` reads the flags: KEY is a parameter of docs/MATRIX.md, VALUE a TOML value
when it parses as one (``threads=4``, ``onednn=false``, ``synthetic_shape=[3,32,32]``,
``variant="123"``), else the text as written (``variant=system``, ``python=/opt/conda/bin/python``).
The values are not checked here: ``matrix.parse_matrix`` checks them with the file's own
checks and applies them (``apply_overrides``), so that a ``--set`` gives exactly the cells that
the same value written in the file's ``[fixed]`` table gives.

Only the flag's form is refused here, each with one line naming the key: no ``=``, an unknown
key, a key given twice, control characters or text that is not UTF-8, a value over
``MAX_OVERRIDE_CHARS``.  A value never reaches a shell.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from matrun.errors import InputError
from matrun.runner.planning.params import PARAMS, show
from matrun.tomltext import TomlError, loads as toml_loads

#: The longest VALUE of one ``--set`` (a ``python`` path may have 4,096 bytes).
MAX_OVERRIDE_CHARS = 8192
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["threads=4", "variant=system"]`` → ``{"threads": 4, "variant": "system"}``, in the
    order given.  Raises ``InputError`` (exit 2) naming the flag's key."""
    found: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--set {_cut(item)}: expected KEY=VALUE, such as threads=4 or variant=system")
        label = f"--set {_cut(key)}"
        if not _utf8(key) or _CONTROL.search(key):
            raise InputError(f"{label}: expected a parameter name of docs/MATRIX.md")
        if key not in PARAMS:
            raise InputError(f"{label}: unknown parameter; known: {', '.join(PARAMS)}")
        if key in found:
            raise InputError(f"{label}: given twice; set each parameter once")
        if len(text) > MAX_OVERRIDE_CHARS:
            raise InputError(f"{label}: a value of {len(text):,} characters; at most {MAX_OVERRIDE_CHARS:,}")
        if not _utf8(text):
            raise InputError(f"{label}: expected a value of UTF-8 text")
        if _CONTROL.search(text):
            raise InputError(f"{label}: expected a value without control characters, got {_cut(show(text))}")
        found[key] = parse_value(text)
    return found


def parse_value(text: str) -> Any:
    """``text`` as a TOML value when it is one, else ``text`` itself (a bare string)."""
    try:
        doc = toml_loads(f"v = {text}")
    except (TomlError, RecursionError, MemoryError):
        return text
    return doc["v"] if list(doc) == ["v"] else text


def spelled(overrides: Mapping[str, Any]) -> str:
    """``--set variant=system --set threads=4`` for titles and messages: one line, each value
    cut to 60 characters, control characters escaped."""
    parts = []
    for key, value in overrides.items():
        text = value if isinstance(value, str) else show(value)
        parts.append(f"--set {_cut(str(key))}={_cut(text)}")
    return " ".join(parts)


def _cut(text: str, limit: int = 60) -> str:
    """``text`` on one line, control characters (and text that is not UTF-8) escaped, cut to
    ``limit`` characters."""
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    if not _utf8(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _utf8(text: str) -> bool:
    """Whether ``text`` is valid Unicode (a command line's bytes that are not UTF-8 arrive as
    lone surrogates, which no terminal or file can take)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
