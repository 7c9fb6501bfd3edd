"""Loading result bundles into the warehouse: idempotent, transactional, bulk.

Every bundle is parsed, validated and turned into its Arrow rows first, each on its own and
outside any transaction: whatever one bundle raises (a bad file, a value no column can hold,
JSON nested too deep) skips that bundle with a reason and never the others.  Then all new
runs and their steps, epochs, layers and monitor samples go in with one transaction (one
INSERT per table, not one per row).  If the warehouse refuses a row all the same, that
transaction rolls back and the bundles go in one transaction each, so only the refused one
is skipped.  A full disk rolls back and raises ``no space left on device: W``: nothing is
half-written and the bundles are kept for the next ingest.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import duckdb
import pyarrow as pa

from matrun.errors import BundleError, InputError, WarehouseError
from matrun.warehouse import catalog, materialise
from matrun.warehouse.bundles.read import (BadBundle, Bundle, BundleIncomplete, bundle_signature,
                                           find_bundles, load_bundle)
from matrun.warehouse.db import is_no_space, no_space_error, open_warehouse, rollback, shown
from matrun.warehouse.maintenance import maintain
from matrun.warehouse.rows import Unstorable, bundle_tables, describe

_NO_SPACE_DETAIL = ("nothing was written to it and the bundles are kept: free some space and "
                    "run `matrun ingest` again")


@dataclass
class IngestReport:
    """What one ingest did, bundle by bundle (paths are bundle directories).

    Each bundle is in exactly one of ``ingested``, ``unchanged``, ``skipped`` (with its
    reason) and ``incomplete``; ``warnings`` are about bundles that were ingested all the
    same.  The counts are :attr:`counts`, and :attr:`clean` says whether nothing was skipped
    (what ``matrun ingest`` exits 0 on).
    """

    ingested: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    incomplete: list[Path] = field(default_factory=list)
    warnings: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """``{"ingested": n, "unchanged": n, "skipped": n, "incomplete": n}``."""
        return {"ingested": len(self.ingested), "unchanged": len(self.unchanged),
                "skipped": len(self.skipped), "incomplete": len(self.incomplete)}

    @property
    def clean(self) -> bool:
        """True when no bundle was skipped (incomplete ones are still running or never ended)."""
        return not self.skipped

    def summary(self) -> str:
        """One line of counts; the reasons are in ``skipped`` and ``warnings``."""
        return (f"ingested {len(self.ingested)} run(s), {len(self.unchanged)} unchanged, "
                f"{len(self.skipped)} skipped, {len(self.incomplete)} incomplete")


#: An ingest writes a transaction whenever the bundles it has read hold this many rows (or
#: at the end), so its memory stays bounded however many bundles it loads.
FLUSH_ROWS = 2_000_000


def ingest(paths: Iterable[Path | str], *, warehouse: Path | str,
           wait_s: float = 0.0) -> IngestReport:
    """Load every bundle under ``paths`` into ``warehouse``; see the module docstring.

    A path that is missing, not a directory, unreadable or too long raises ``InputError``
    before the warehouse is opened; a full disk raises ``WarehouseError`` (nothing of the
    transaction that met it written).
    """
    report = IngestReport()
    dirs = _bundle_dirs(paths)
    with open_warehouse(warehouse, wait_s=wait_s) as wh:  # created and migrated before reading
        known = _known_stats(wh.con, dirs)
    pending: list[tuple[Bundle, dict[str, pa.Table]]] = []
    rows = 0
    for directory in dirs:
        stamp = bundle_signature(directory)  # before reading: a change meanwhile reads it again
        if known.get(str(directory)) == stamp:
            report.unchanged.append(directory)  # recognised without reading it
            continue
        bundle = _load(directory, report)
        prepared = None if bundle is None else _prepare(bundle, report)
        if prepared is None:
            continue
        prepared["runs"] = prepared["runs"].append_column("bundle_stat", pa.array([stamp], pa.string()))
        pending.append((bundle, prepared))
        rows += sum(table.num_rows for table in prepared.values())
        if rows >= FLUSH_ROWS:
            _flush(warehouse, wait_s, pending, report)
            pending, rows = [], 0
    _flush(warehouse, wait_s, pending, report)
    return report


def _flush(warehouse: Path | str, wait_s: float,
           pending: list[tuple[Bundle, dict[str, pa.Table]]], report: IngestReport) -> None:
    """Write the bundles read so far that are new, in one transaction under the writer lock
    (a catalog several hosts share: see :func:`_flush_shared`)."""
    if not pending:
        return
    with open_warehouse(warehouse, wait_s=wait_s) as wh:
        if not catalog.layout(wh.path).local:
            _flush_shared(wh.con, wh.path, pending, report)
        else:
            new = {id(b) for b in _select_new(wh.con, [b for b, _ in pending], report)}
            report.ingested += _insert_all(wh.con, wh.path, [(b, t) for b, t in pending if id(b) in new], report)
        try:
            maintain(wh.con)
        except duckdb.Error as exc:  # the runs are in; only the files stay many
            report.warnings.append((wh.path, f"compaction failed ({_first_line(exc)[:200]}); the "
                                             "runs are in: run `matrun warehouse compact` later"))


# -- several hosts: a shared catalog (docs/WAREHOUSE.md "Several hosts") --------------------


def _flush_shared(con: duckdb.DuckDBPyConnection, path: Path,
                  pending: list[tuple[Bundle, dict[str, pa.Table]]], report: IngestReport) -> None:
    """``_flush`` for a catalog other hosts write at the same time (no lock orders them):
    each transaction claims the writer epoch and selects the new bundles inside it, so of two
    that overlap DuckLake commits one; the other is rolled back and done again with what the
    first wrote in sight (``catalog.retry_conflicts``).  A value the warehouse refuses sends
    the bundles in one transaction each, as in ``_insert_all``."""
    done = IngestReport()
    try:
        try:
            done = catalog.retry_conflicts(path, lambda: _claimed_write(con, pending))
        except (duckdb.DataError, duckdb.IntegrityError):
            for item in pending:
                try:
                    one = catalog.retry_conflicts(path, lambda item=item: _claimed_write(con, [item]))
                except (duckdb.DataError, duckdb.IntegrityError) as exc:
                    done.skipped.append((item[0].path, f"the warehouse refused it: {_first_line(exc)[:300]}"))
                else:
                    done.ingested += one.ingested
                    done.unchanged += one.unchanged
                    done.skipped += one.skipped
    except duckdb.Error as exc:
        raise _failure(path, exc, written=len(done.ingested)) from None
    report.ingested += done.ingested
    report.unchanged += done.unchanged
    report.skipped += done.skipped


def _claimed_write(con: duckdb.DuckDBPyConnection,
                   items: list[tuple[Bundle, dict[str, pa.Table]]]) -> IngestReport:
    """One transaction: select the new bundles among ``items``; when there are any, claim the
    writer epoch and insert their rows (the transaction reads one snapshot, so the claim
    conflicts with any writer's that committed after the selection).  What it did is returned
    (``ingested``, ``unchanged``, ``skipped``); ``catalog.WriterConflict`` when DuckLake
    refused the commit (rolled back)."""
    done = IngestReport()
    con.execute("BEGIN TRANSACTION")
    try:
        new = {id(b) for b in _select_new(con, [b for b, _ in items], done)}
        chosen = [tables for bundle, tables in items if id(bundle) in new]
        if chosen:
            catalog.claim_writer(con)
            for name in chosen[0]:
                _insert_table(con, name, pa.concat_tables([tables[name] for tables in chosen]))
        con.execute("COMMIT")
    except BaseException as exc:
        rollback(con)
        if catalog.is_conflict(exc):
            raise catalog.WriterConflict(" ".join(str(exc).split())) from None
        raise
    done.ingested = [bundle.path for bundle, _ in items if id(bundle) in new]
    return done


def _known_stats(con: duckdb.DuckDBPyConnection, dirs: Sequence[Path]) -> dict[str, str]:
    """``{bundle_path: bundle_stat}`` of the runs already ingested from these directories."""
    if not dirs:
        return {}
    candidates = pa.table({"bundle_path": pa.array([str(d) for d in dirs], pa.string())})
    con.register("_matrun_paths", candidates)
    try:
        return dict(con.execute(
            "SELECT r.bundle_path, r.bundle_stat FROM runs AS r JOIN _matrun_paths AS p "
            "ON p.bundle_path = r.bundle_path WHERE r.bundle_stat IS NOT NULL").fetchall())
    finally:
        con.unregister("_matrun_paths")


def check_paths(paths: Iterable[Path | str]) -> list[Path]:
    """The paths an ingest reads, each checked to be a readable directory; ``InputError``
    (bad input) naming the first that is not."""
    roots = [Path(p) for p in paths]
    for root in roots:
        try:
            is_dir = stat.S_ISDIR(os.stat(root).st_mode)
            if is_dir:
                with os.scandir(root) as entries:
                    next(entries, None)
        except FileNotFoundError:
            raise InputError(f"{shown(root)}: no such directory; give a results directory "
                             "or a bundle") from None
        except OSError as exc:
            reason = "file name too long" if exc.errno == errno.ENAMETOOLONG else exc.strerror or str(exc)
            raise InputError(f"{shown(root)}: cannot be read: {reason}") from None
        if not is_dir:
            raise InputError(f"{shown(root)}: is not a directory; give a results directory or a bundle")
    return roots


def _bundle_dirs(paths: Iterable[Path | str]) -> list[Path]:
    roots = check_paths(paths)
    seen: set[Path] = set()
    dirs = []
    for root in roots:
        try:
            found = list(find_bundles(root))
        except OSError as exc:
            raise InputError(f"{shown(root)}: cannot be read: {exc.strerror or exc}") from None
        for directory in found:
            resolved = directory.resolve()
            if resolved not in seen:
                seen.add(resolved)
                dirs.append(resolved)
    return dirs


def _load(directory: Path, report: IngestReport) -> Bundle | None:
    """The bundle in ``directory``, or None with the reason (or its incompleteness) recorded."""
    try:
        bundle = load_bundle(directory)
    except BundleIncomplete:
        report.incomplete.append(directory)
    except BadBundle as exc:
        report.skipped.append((directory, exc.short()))
    except BundleError as exc:
        report.skipped.append((directory, str(exc)))
    except Exception as exc:  # whatever one bundle raises skips that bundle, not the ingest
        report.skipped.append((directory, f"cannot be read: {describe(exc)}"))
    else:
        report.warnings += [(directory, text) for text in bundle.warnings]
        return bundle
    return None


def _select_new(con: duckdb.DuckDBPyConnection, bundles: list[Bundle],
                report: IngestReport) -> list[Bundle]:
    """Bundles not yet in the warehouse; the rest are unchanged or conflicts."""
    candidates = pa.table({"run_id": pa.array([b.run_id for b in bundles], pa.string())})
    con.register("_matrun_candidates", candidates)
    try:
        known = dict(con.execute(
            "SELECT r.run_id, r.bundle_digest FROM runs AS r "
            "JOIN _matrun_candidates AS c ON c.run_id = r.run_id").fetchall())
    finally:
        con.unregister("_matrun_candidates")
    new = []
    for bundle in bundles:
        digest = known.get(bundle.run_id)
        if digest is None:
            known[bundle.run_id] = bundle.digest
            new.append(bundle)
        elif digest == bundle.digest:
            report.unchanged.append(bundle.path)
        else:
            report.skipped.append((bundle.path, (
                f"conflict: run {bundle.run_id} is already in the warehouse with different "
                f"content (digest {digest[:12]}, this bundle {bundle.digest[:12]}); a run is "
                "never overwritten: rebuild the warehouse from bundles to replace it")))
    return new


def _prepare(bundle: Bundle, report: IngestReport) -> dict[str, pa.Table] | None:
    """The bundle's tables, or None (skipped with the reason) when they cannot be built."""
    try:
        return bundle_tables(bundle)
    except Unstorable as exc:
        report.skipped.append((bundle.path, f"cannot be stored: {exc}"))
    except Exception as exc:  # anything else one bundle raises skips that bundle alone
        report.skipped.append((bundle.path, f"cannot be stored: {describe(exc)}"))
    return None


def _insert_all(con: duckdb.DuckDBPyConnection, path: Path,
                prepared: list[tuple[Bundle, dict[str, pa.Table]]], report: IngestReport) -> list[Path]:
    """Write the prepared bundles in one transaction; return the paths written.  When the
    warehouse refuses a value (a data or constraint error), retry one transaction per bundle
    and skip the refused ones; any other failure leaves the warehouse as it was and raises."""
    if not prepared:
        return []
    try:
        _write(con, [tables for _, tables in prepared])
        return [bundle.path for bundle, _ in prepared]
    except (duckdb.DataError, duckdb.IntegrityError):
        pass  # one bundle's value, probably: find which below
    except duckdb.Error as exc:
        raise _failure(path, exc) from None
    written = []
    for bundle, tables in prepared:
        try:
            _write(con, [tables])
        except (duckdb.DataError, duckdb.IntegrityError) as exc:
            report.skipped.append((bundle.path, f"the warehouse refused it: {_first_line(exc)[:300]}"))
        except duckdb.Error as exc:
            raise _failure(path, exc, written=len(written)) from None
        else:
            written.append(bundle.path)
    return written


def _failure(path: Path, exc: duckdb.Error, *, written: int = 0) -> WarehouseError:
    """The error for an ingest transaction that failed and was rolled back (``written``: runs
    already committed, each in its own transaction, before it)."""
    if is_no_space(exc):
        return no_space_error(path, _NO_SPACE_DETAIL if not written else (
            f"{written} run(s) were written before the disk filled up and the bundles are kept: "
            "free some space and run `matrun ingest` again"))
    if written:
        return WarehouseError(f"ingest into warehouse {path} failed: {_first_line(exc)}; {written} "
                              "run(s) were written before it and the bundles are kept: run "
                              "`matrun ingest` again")
    return WarehouseError(f"ingest into warehouse {path} failed and was rolled back, "
                          f"nothing was written: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _write(con: duckdb.DuckDBPyConnection, bundles: list[dict[str, pa.Table]]) -> None:
    """Insert these bundles' tables in one transaction, or nothing (it rolls back)."""
    tables = {name: pa.concat_tables([b[name] for b in bundles]) for name in bundles[0]}
    con.execute("BEGIN TRANSACTION")
    try:
        for name, table in tables.items():
            _insert_table(con, name, table)
        materialise.refresh(con)
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


def _insert_table(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
    """Bulk-insert an Arrow table into the warehouse table of the same column names."""
    if table.num_rows == 0:
        return
    con.register("_matrun_new_rows", table)
    try:
        con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _matrun_new_rows")
    finally:
        try:
            con.unregister("_matrun_new_rows")
        except duckdb.Error:
            pass  # a failed INSERT aborted the transaction; the next register replaces it


# -- Arrow tables ------------------------------------------------------------------------
