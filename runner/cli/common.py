"""What every command module of the CLI shares: the Typer app, how a command is registered,
the shared options, the consoles and the warehouse a command uses by default.

A command module registers its commands with :func:`command` (on ``app`` or on a sub-group
made by :func:`group`); that is the only way commands are registered, and the one place
where a library ``MatrunError`` becomes ``Error: …`` on stderr with exit code 2 (bad input)
or 1 (failure).  ``app`` holds only the commands of the modules imported so far:
``matrun.runner.cli.main`` imports them all.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, TypeVar

import typer
from rich.console import Console

from matrun.errors import InputError, MatrunError
from matrun.runner.planning.matrix import load_matrix

app = typer.Typer(
    name="matrun",
    help="Run deep-learning benchmark matrices, keep every run in DuckDB, report with SQL and Plotly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: Tables and results (stdout), wide when piped; progress and notes go to ``err`` (stderr).
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

MatrixArg = Annotated[Path, typer.Argument(help="The matrix file.", show_default=True)]
WhereOpt = Annotated[list[str], typer.Option(
    "--where", "-w", help="Only cells whose parameter has one of these values: KEY=V[,V…] "
    "(repeatable; KEY may be 'cell' for a cell-id prefix).")]
WarehouseOpt = Annotated[Optional[Path], typer.Option(
    "--warehouse", help="DuckDB file (default: the one matrix.toml names, else ./matrun.duckdb).")]
TableFormatOpt = Annotated[str, typer.Option("--format", "-f", help="table, csv or json.")]

F = TypeVar("F", bound=Callable[..., Any])


def command(group: typer.Typer, name: str | None = None) -> Callable[[F], F]:
    """Register the decorated function as command ``name`` (default: its own name) of ``group``.

    The registered callback prints a ``MatrunError`` as ``Error: …`` and exits with its code;
    the function itself is returned unchanged.
    """
    def register(fn: F) -> F:
        group.command(name)(_print_errors(fn))
        return fn

    return register


def group(name: str, *, help: str) -> typer.Typer:
    """A sub-command group ``matrun NAME …`` of ``app``; register its commands with :func:`command`."""
    sub = typer.Typer(help=help, no_args_is_help=True)
    app.add_typer(sub, name=name)
    return sub


def _print_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MatrunError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def resolve_warehouse(explicit: Path | None) -> Path:
    """The warehouse a command uses: ``--warehouse``, else the one ./matrix.toml names, else
    ./matrun.duckdb."""
    if explicit is not None:
        return explicit
    default_matrix = Path("matrix.toml")
    if default_matrix.is_file():
        return load_matrix(default_matrix).sweep.warehouse
    return Path("matrun.duckdb")


def check_format(fmt: str, allowed: tuple[str, ...]) -> None:
    """Refuse a ``--format`` value that is not one of ``allowed`` (bad input, exit 2)."""
    if fmt not in allowed:
        raise InputError(f"--format {fmt!r}: expected {', '.join(allowed[:-1])} or {allowed[-1]}")
