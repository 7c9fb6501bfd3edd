"""The host's registry of cell parameters, built from the harness's declaration.

Every parameter is declared once, in ``runner/harness/spec.py`` (the harness checks spec.json
with the same declaration, inside the cell).  The host adds what only it knows: the
frameworks it can build (``images/<name>/framework.toml``), which become the choices of
``framework``.  Each check takes a raw TOML value and returns the canonical value or raises
``ParamError`` with the words that follow the key path in the user's message, e.g.
``expected a positive integer, got "big"``.

Also here: how a parameter value is spelled in labels, tables and ``--where`` (``plain``,
``as_text``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from matrun.frameworks import default_framework, frameworks
from matrun.runner.harness.spec import PARAMS as CELL_PARAMS
from matrun.runner.harness.spec import Choice, Param
from matrun.runner.harness.spec import ParamError, show  # noqa: F401  (re-exported: the host's checks raise it)

FRAMEWORKS = tuple(frameworks())

PARAMS: dict[str, Param] = {
    **CELL_PARAMS,
    "framework": replace(CELL_PARAMS["framework"], check=Choice(FRAMEWORKS), default=default_framework()),
}


def plain(value: Any) -> str:
    """A value as a cell's label shows it (``synthetic_shape`` as ``3x32x32``)."""
    return str(value) if not isinstance(value, list) else "x".join(map(str, value))


def as_text(value: Any) -> str:
    """A value as ``--where`` and the plan's table spell it (``true``, ``0.5``, ``2``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return plain(value)
