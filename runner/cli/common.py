"""What every command module of the CLI shares: the Typer app, how a command is registered,
the shared options, the consoles and the warehouse a command uses by default.

A command module registers its commands with :func:`command` (on ``app`` or on a sub-group
made by :func:`group`); that is the only way commands are registered, and the one place
where a library ``MatrunError`` becomes ``Error: …`` on stderr with exit code 2 (bad input)
or 1 (failure).  ``app`` holds only the commands of the modules imported so far:
``matrun.runner.cli.main`` imports them all.

``--help`` names every value in words (``--warehouse FILE``, ``SQL``), never by its Python
type (``<path>``, ``<str>``): an option or argument gives its ``metavar``, else its name in
capitals stands in (:class:`ReadableCommand`); a flag, which takes no value, shows none.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, TypeVar

import typer
from rich.console import Console
from typer.core import TyperArgument, TyperCommand, TyperGroup

import matrun
from matrun.errors import InputError, MatrunError
from matrun.runner.planning.matrix import load_matrix


class _ReadableHelp:
    """Names every value of a command's help in words, not by its Python type.

    Typer writes a parameter without a ``metavar`` as its type (``<str>``, ``<path>``,
    ``--force <bool>``); here an option without one gets its name in capitals, a flag (and
    ``--help``) none at all, and an argument shows its ``metavar`` in place of its name with
    no type beside it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:  # type: ignore[attr-defined]
            _name_value(param)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


def _name_value(param: Any) -> None:
    if isinstance(param, TyperArgument):
        param.metavar = param.metavar or param.name.upper().replace("_", "-")
        param.display_type_rich = _no_type  # the metavar in the name column says it all
    elif getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.metavar = ""
    elif param.metavar is None:
        param.metavar = param.name.upper().replace("_", "-")


def _no_type(ctx: Any) -> None:
    return None


class ReadableCommand(_ReadableHelp, TyperCommand):
    """A command whose ``--help`` names values in words (see :class:`_ReadableHelp`)."""


class ReadableGroup(_ReadableHelp, TyperGroup):
    """A command group whose ``--help`` names values in words (see :class:`_ReadableHelp`)."""


app = typer.Typer(
    name="matrun",
    cls=ReadableGroup,
    help="Run deep-learning benchmark matrices, keep every run in DuckDB, report with SQL and Plotly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"matrun {matrun.__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print matrun's version and exit.")] = False) -> None:
    """The options of ``matrun`` itself, before any command: ``--version``."""


#: Tables and results (stdout), wide when piped; progress and notes go to ``err`` (stderr).
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

MatrixArg = Annotated[Path, typer.Argument(metavar="MATRIX", help="The matrix file.", show_default=True)]
ProfileOpt = Annotated[Optional[str], typer.Option(
    "--profile", "-p", metavar="NAME", help="Apply the matrix's \\[profiles.NAME] (e.g. quick; `matrun studies` "
    "lists each study's profiles).")]
SetOpt = Annotated[list[str], typer.Option(
    "--set", metavar="KEY=VALUE", help="Set a cell parameter in every cell, after the profile, as \\[fixed] KEY = VALUE "
    "in the file would (repeatable; VALUE is read as TOML when it is, else as text: --set threads=4 --set "
    "variant=system --set python=/opt/conda/bin/python).")]
WhereOpt = Annotated[list[str], typer.Option(
    "--where", "-w", metavar="KEY=V[,V…]", help="Only cells whose parameter KEY has one of these values "
    "(repeatable; KEY may be 'cell' for a cell-id prefix).")]
WarehouseOpt = Annotated[Optional[Path], typer.Option(
    "--warehouse", metavar="DIR", help="The warehouse (default: the one matrix.toml names, else ./matrun.duckdb).")]
TableFormatOpt = Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="table, csv or json.")]

F = TypeVar("F", bound=Callable[..., Any])


def command(group: typer.Typer, name: str | None = None) -> Callable[[F], F]:
    """Register the decorated function as command ``name`` (default: its own name) of ``group``.

    The registered callback prints a ``MatrunError`` as ``Error: …`` and exits with its code;
    the function itself is returned unchanged.
    """
    def register(fn: F) -> F:
        group.command(name, cls=ReadableCommand)(_print_errors(fn))
        return fn

    return register


def group(name: str, *, help: str) -> typer.Typer:
    """A sub-command group ``matrun NAME …`` of ``app``; register its commands with :func:`command`."""
    sub = typer.Typer(help=help, no_args_is_help=True, cls=ReadableGroup)
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
        except BrokenPipeError:  # stdout's reader went away (`matrun query … | head`)
            _quiet_stdout()
            raise typer.Exit(1) from None
        except Exception as exc:
            if not _engine_failure(exc):
                raise
            text = " ".join(str(exc).split())[:300] or type(exc).__name__
            typer.echo(f"Error: the Docker engine failed a request ({type(exc).__name__}): {text}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def _engine_failure(exc: BaseException) -> bool:
    """A failure of the Docker SDK or of its HTTP transport (an engine that timed out, went
    away mid-request or answered an error nothing in matrun expected): an ``Error:`` line,
    not a traceback.  Told by module, so that neither is imported to ask."""
    return any(str(cls.__module__).split(".")[0] in ("docker", "requests", "urllib3") for cls in type(exc).__mro__)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit cannot fail on
    the closed pipe again (the recipe of Python's documentation, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def resolve_warehouse(explicit: Path | None) -> Path:
    """The warehouse a command uses: ``--warehouse``, else the one ./matrix.toml names, else
    ./matrun.duckdb."""
    if explicit is not None:
        return explicit
    default_matrix = Path("matrix.toml")
    if default_matrix.is_file():
        return load_matrix(default_matrix).sweep.warehouse
    return Path("matrun.duckdb")


def duration_text(value: float | None) -> str:
    """Seconds as ``1h05m`` or ``3m07s`` (``-`` for None), as plan, sweep and studies show them."""
    if value is None:
        return "-"
    value = int(round(value))
    return f"{value // 3600}h{value % 3600 // 60:02d}m" if value >= 3600 else f"{value // 60}m{value % 60:02d}s"


def check_format(fmt: str, allowed: tuple[str, ...]) -> None:
    """Refuse a ``--format`` value that is not one of ``allowed`` (bad input, exit 2)."""
    if fmt not in allowed:
        raise InputError(f"--format {fmt!r}: expected {', '.join(allowed[:-1])} or {allowed[-1]}")
