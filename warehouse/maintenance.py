"""Keeping a warehouse's files few: compaction after ingests (docs/WAREHOUSE.md "Compaction").

Each ingest transaction that adds more than a few rows to a table writes one Parquet file for
it (smaller inserts stay inlined in the catalog), so a sweep that ingests after every cell
leaves one small file per cell and table, and reading many small files is slow.  After an
ingest, once a table has more than ``MAX_FILES`` data files, :func:`maintain` moves the
inlined rows into Parquet, merges adjacent small files, and deletes the files no snapshot
younger than ``KEEP_SNAPSHOTS`` still needs: a reader holding an older snapshot than that is
the only one that could miss them.  Runs under the writer lock, in the writer's connection.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from matrun.warehouse.db import LAKE

#: More data files than this in one table start a compaction.
MAX_FILES = 64
#: Snapshots (and the files only they use) are kept this long for readers still on them.
KEEP_SNAPSHOTS = "1 hour"


@dataclass(frozen=True)
class Compaction:
    """What one compaction did: data files before and after, and old files deleted."""

    files_before: int
    files_after: int
    deleted: int


def data_files(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """``{table: number of Parquet data files}`` of the lake ``con`` uses."""
    return dict(con.execute(f"SELECT table_name, file_count FROM ducklake_table_info('{LAKE}')").fetchall())


def maintain(con: duckdb.DuckDBPyConnection, *, force: bool = False) -> Compaction | None:
    """Compact when a table has more than ``MAX_FILES`` files (or always, with ``force``);
    returns what was done, or None when nothing needed doing."""
    before = data_files(con)
    if not force and max(before.values(), default=0) <= MAX_FILES:
        return None
    con.execute(f"CALL ducklake_flush_inlined_data('{LAKE}')")
    con.execute(f"CALL ducklake_merge_adjacent_files('{LAKE}')")
    con.execute(f"CALL ducklake_expire_snapshots('{LAKE}', older_than => now() - INTERVAL '{KEEP_SNAPSHOTS}')")
    deleted = con.execute(f"CALL ducklake_cleanup_old_files('{LAKE}', older_than => now() - "
                          f"INTERVAL '{KEEP_SNAPSHOTS}')").fetchall()
    return Compaction(sum(before.values()), sum(data_files(con).values()), len(deleted))
