"""The host's registry of cell parameters, built from the harness's declaration.

Every parameter is declared once, in ``runner/harness/spec.py`` (the harness checks spec.json
with the same declaration, inside the cell).  The host adds what only it knows: the
frameworks it can build (``images/<name>/framework.toml``), which become the choices of
``framework``.  Each check takes a raw TOML value and returns the canonical value or raises
``ParamError`` with the words that follow the key path in the user's message, e.g.
``expected a positive integer, got "big"``.  The host also bounds what the harness need not:
``timeout`` (at most ``MAX_TIMEOUT``) and ``train_limit`` / ``test_limit`` (32-bit), so that no
value of a plan overflows a timer, a Slurm time limit or a warehouse column.

Also here: how a parameter value is spelled in labels, tables and ``--where`` (``plain``,
``as_text``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from matrun.frameworks import default_framework, frameworks
from matrun.runner.harness.spec import PARAMS as CELL_PARAMS
from matrun.runner.harness.spec import Choice, Param, integer
from matrun.runner.harness.spec import ParamError, show  # noqa: F401  (re-exported: the host's checks raise it)

FRAMEWORKS = tuple(frameworks())
#: The longest timeout a cell may have, in seconds (30 days).
MAX_TIMEOUT = 30 * 86_400
#: The largest ``train_limit`` / ``test_limit`` (a 32-bit integer, as the warehouse holds it).
MAX_LIMIT = 2**31 - 1


def _timeout(value: Any) -> float:
    """The harness's check of a timeout, and at most ``MAX_TIMEOUT``."""
    seconds = CELL_PARAMS["timeout"].check(value)
    if seconds > MAX_TIMEOUT:
        raise ParamError(f"expected a positive number of seconds, at most {MAX_TIMEOUT:,} (30 days), "
                         f"got {show(value)}")
    return seconds


#: The parameters whose check the host narrows (the rest of their declaration is the harness's).
HOST_BOUNDED = ("train_limit", "test_limit", "timeout")

PARAMS: dict[str, Param] = {
    **CELL_PARAMS,
    "framework": replace(CELL_PARAMS["framework"], check=Choice(FRAMEWORKS), default=default_framework()),
    "train_limit": replace(CELL_PARAMS["train_limit"], check=integer(0, MAX_LIMIT)),
    "test_limit": replace(CELL_PARAMS["test_limit"], check=integer(0, MAX_LIMIT)),
    "timeout": replace(CELL_PARAMS["timeout"], check=_timeout),
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
