"""``matrun warehouse init|info|compact|upgrade``: a warehouse several hosts share, what a
warehouse holds, compacting its files now, and bringing it up to this matrun.

Thin wrappers over ``warehouse/catalog.py`` (``create_shared``, ``lake_info``),
``warehouse/maintenance.py`` and ``warehouse/db.py`` (``upgrade_warehouse``); docs/WAREHOUSE.md
"Several hosts" and "Upgrading", docs/CLI.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import duckdb
import typer

from matrun.runner.cli.common import WarehouseOpt, command, group, resolve_warehouse
from matrun.warehouse import catalog
from matrun.warehouse.db import database_error, migrations, open_warehouse, upgrade_warehouse
from matrun.warehouse.maintenance import KEEP_SNAPSHOTS, Compaction, maintain

warehouse_app = group(
    "warehouse", help="Set up a warehouse several hosts share (a PostgreSQL catalog, Parquet files on a "
                      "shared path), show what a warehouse holds, compact its files.")


@command(warehouse_app, "init")
def init(
    path: Annotated[Path, typer.Argument(
        metavar="WAREHOUSE", help="The new warehouse directory (absent or empty): what this host's --warehouse "
        "names.")],
    postgres: Annotated[str, typer.Option(
        "--postgres", metavar="CONNINFO", help="libpq connection string of the catalog's PostgreSQL database, "
        "e.g. \"host=db.example.org dbname=matrun user=matrun\" (no password in it: ~/.pgpass holds that).")],
    data: Annotated[Path, typer.Option(
        "--data", metavar="DIR", help="Absolute directory for the Parquet files, the same one every host sees "
        "(NFS, Lustre, …); created when missing.")],
) -> None:
    """Create a warehouse whose catalog is a PostgreSQL database, for several hosts at once."""
    lay, existed = catalog.create_shared(path, postgres=postgres, data=data)
    with open_warehouse(lay.path) as wh:  # the first writer's open: migrations and views
        facts = catalog.lake_info(wh.con)
    what = (f"joined the lake already in the catalog ({facts.runs} run(s))" if existed
            else "created a new lake in the catalog")
    typer.echo(f"warehouse {lay.path}: {what}; schema version {facts.schema_version}")
    typer.echo(f"  catalog  postgres: {catalog.shown_conninfo(lay.catalog.removeprefix('postgres:'))}")
    typer.echo(f"  data     {lay.data}{'' if str(lay.data).endswith('/') else '/'}")
    typer.echo(f"every host: a directory holding this {catalog.CONFIG} (`matrun warehouse init` with the same "
               "--postgres and --data, or a copy), named by --warehouse or [sweep] warehouse")


@command(warehouse_app, "info")
def info(warehouse: WarehouseOpt = None) -> None:
    """Show a warehouse's layout, catalog, data path, schema, runs, snapshot, files, and attach.sql."""
    path = resolve_warehouse(warehouse)
    with open_warehouse(path, read_only=True) as wh:
        lay = catalog.layout(wh.path)
        facts = catalog.lake_info(wh.con)
    for key, value in info_lines(lay, facts):
        typer.echo(f"{key:<12}{value}")
    if catalog.stale_attach_sql(lay):
        typer.echo(f"note: {catalog.ATTACH_SQL} is an older matrun's (it names the place it was written in, "
                   f"not where the warehouse is now); the next write rewrites it (matrun warehouse upgrade)")
    line = (f"cd {lay.path} && duckdb -init {catalog.ATTACH_SQL}" if lay.local
            else f"duckdb -init {lay.path / catalog.ATTACH_SQL}")
    typer.echo(f"a plain client (DuckDB {duckdb.__version__} with the ducklake and "
               f"{'sqlite' if lay.local else 'postgres'} extensions installed) reads it with `{line}`; "
               "`matrun shell` opens it from anywhere; in a client here, these statements open it:")
    for statement in catalog.attach_statements(lay, read_only=True):
        typer.echo(f"  {statement};")


def info_lines(lay: catalog.Layout, facts: catalog.LakeInfo) -> list[tuple[str, str]]:
    """``matrun warehouse info``'s lines (key, value) for the layout ``lay`` holding ``facts``."""
    if lay.local:
        where = f"sqlite: {lay.path / catalog.CATALOG}"
        writers = f"one host; its writers take turns on {catalog.WRITER_LOCK} (flock)"
    else:
        where = f"postgres: {catalog.shown_conninfo(lay.catalog.removeprefix('postgres:'))}"
        writers = ("several hosts; DuckLake's transactions order them (a conflicting ingest is "
                   "done again), no file lock")
    files = {name: count for name, count in facts.data_files.items() if count}
    newest = migrations()[-1].version
    return [("warehouse", str(lay.path)),
            ("layout", "DuckLake directory (a catalog, Parquet files, attach.sql)"),
            ("catalog", where),
            ("writers", writers),
            ("data", f"{lay.data}/"),
            ("schema", f"version {facts.schema_version} (this matrun knows up to {newest})"),
            ("runs", str(facts.runs)),
            ("snapshot", str(facts.snapshot)),
            ("data files", f"{sum(files.values())}" + (f" ({', '.join(f'{n} {c}' for n, c in files.items())})"
                                                         if files else "")),
            ("attach.sql", str(lay.path / catalog.ATTACH_SQL))]


@command(warehouse_app, "compact")
def compact(
    warehouse: WarehouseOpt = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for another writer to finish.")] = 0.0,
) -> None:
    """Compact the files now: inlined rows written out, small files merged, old snapshots' files deleted."""
    path = resolve_warehouse(warehouse)
    with open_warehouse(path, wait_s=wait) as wh:
        done = catalog.retry_conflicts(wh.path, lambda: _compact(wh.con, wh.path))
    typer.echo(f"data files: {done.files_before} before, {done.files_after} after; {done.deleted} "
               f"file(s) that no snapshot of the last {KEEP_SNAPSHOTS} needs deleted")


def _compact(con: duckdb.DuckDBPyConnection, path: Path) -> Compaction:
    """One forced compaction; a conflict with another host's writer is ``WriterConflict``."""
    try:
        return maintain(con, force=True) or Compaction(0, 0, 0)
    except duckdb.Error as exc:
        if catalog.is_conflict(exc):
            raise catalog.WriterConflict(" ".join(str(exc).split())) from None
        raise database_error(path, exc) from None


@command(warehouse_app, "upgrade")
def upgrade(
    warehouse: WarehouseOpt = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for another writer to finish.")] = 0.0,
) -> None:
    """Bring a warehouse up to this matrun now: upgrade an older matrun's single-file warehouse, migrations, views."""
    path = resolve_warehouse(warehouse)
    done, version = upgrade_warehouse(path, wait_s=wait)
    for line in done:
        typer.echo(f"warehouse {path}: {line}")
    typer.echo(f"warehouse {path}: schema version {version}, with this matrun's views")
