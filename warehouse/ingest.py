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
import json
import os
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Sequence

import duckdb
import pyarrow as pa

from matrun.errors import BundleError, InputError, WarehouseError
from matrun.warehouse.bundles.layout import EVENTS
from matrun.warehouse.bundles.read import BadBundle, Bundle, BundleIncomplete, find_bundles, load_bundle
from matrun.warehouse.db import is_no_space, no_space_error, open_warehouse, rollback, shown

_TS = pa.timestamp("us", tz="UTC")

RUNS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("sweep", pa.string()), ("cell_id", pa.string()),
    ("repeat", pa.int32()), ("attempt", pa.int32()), ("env_id", pa.string()),
    ("executor", pa.string()), ("status", pa.string()), ("exit_code", pa.int32()),
    ("error_tail", pa.string()), ("started_at", _TS), ("ended_at", _TS),
    ("wall_seconds", pa.float64()),
    ("params", pa.string()), ("host", pa.string()), ("probe", pa.string()),
    ("data", pa.string()), ("model", pa.string()), ("summary", pa.string()),
    ("monitor", pa.string()), ("harness_version", pa.string()),
    ("train_seconds", pa.float64()), ("test_seconds", pa.float64()),
    ("accuracy", pa.float64()), ("throughput", pa.float64()),
    ("time_to_first_step", pa.float64()), ("timed_steps", pa.int32()),
    ("warmup_steps", pa.int32()), ("diverged", pa.bool_()),
    ("monitor_interval_s", pa.float64()), ("monitor_samples", pa.int32()),
    ("cpu_user_avg", pa.float64()), ("cpu_system_avg", pa.float64()),
    ("cpu_total_avg", pa.float64()), ("iowait_avg", pa.float64()),
    ("rss_avg_bytes", pa.float64()), ("rss_peak_bytes", pa.int64()),
    ("mismatches", pa.list_(pa.string())), ("events_truncated", pa.bool_()),
    ("bundle_path", pa.string()), ("bundle_digest", pa.string()),
    ("image_tag", pa.string()), ("image_id", pa.string()), ("image_digest", pa.string()),
])
STEPS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("epoch", pa.int32()), ("step", pa.int32()),
    ("phase", pa.string()), ("seconds", pa.float64()), ("images", pa.int32()),
])
EPOCHS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("epoch", pa.int32()), ("steps", pa.int32()),
    ("train_loss", pa.float64()), ("train_accuracy", pa.float64()),
    ("test_loss", pa.float64()), ("test_accuracy", pa.float64()),
    ("epoch_seconds", pa.float64()), ("test_seconds", pa.float64()),
])
LAYERS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("name", pa.string()), ("kind", pa.string()), ("index", pa.int32()),
    ("forward_seconds", pa.float64()), ("backward_seconds", pa.float64()), ("repeats", pa.int32()),
    ("params", pa.int64()), ("flops", pa.int64()),
])
SAMPLES_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("t", pa.float64()), ("cpu_user", pa.float64()),
    ("cpu_system", pa.float64()), ("iowait", pa.float64()), ("rss_bytes", pa.int64()),
    ("nprocs", pa.int32()),
])
_SUMMARY_COLUMNS = ("train_seconds", "test_seconds", "accuracy", "throughput",
                    "time_to_first_step", "timed_steps", "warmup_steps", "diverged")
_MONITOR_COLUMNS = {"monitor_interval_s": "interval_s", "monitor_samples": "samples",
                    "cpu_user_avg": "cpu_user_avg", "cpu_system_avg": "cpu_system_avg",
                    "cpu_total_avg": "cpu_total_avg", "iowait_avg": "iowait_avg",
                    "rss_avg_bytes": "rss_avg_bytes", "rss_peak_bytes": "rss_peak_bytes"}


#: Columns the migrations declare NOT NULL (``migrations/001_initial.sql``, ``002_layers.sql``),
#: checked per bundle before the transaction.
NOT_NULL = {
    "runs": ("run_id", "sweep", "cell_id", "repeat", "attempt", "env_id", "executor", "status",
             "started_at", "params", "events_truncated", "bundle_path", "bundle_digest"),
    "steps": ("run_id", "step", "phase", "seconds", "images"),
    "epochs": ("run_id", "epoch"),
    "monitor_samples": ("run_id", "t"),
    "layers": ("run_id", "name", "kind"),
}
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


def ingest(paths: Iterable[Path | str], *, warehouse: Path | str,
           wait_s: float = 0.0) -> IngestReport:
    """Load every bundle under ``paths`` into ``warehouse``; see the module docstring.

    A path that is missing, not a directory, unreadable or too long raises ``InputError``
    before the warehouse is opened; a full disk raises ``WarehouseError`` (nothing written).
    """
    report = IngestReport()
    bundles = _load_all(_bundle_dirs(paths), report)
    with open_warehouse(warehouse, wait_s=wait_s) as wh:
        new = _select_new(wh.con, bundles, report)
        report.ingested = _insert_all(wh.con, wh.path, _prepare_all(new, report), report)
    return report


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


def _load_all(dirs: Sequence[Path], report: IngestReport) -> list[Bundle]:
    bundles = []
    for directory in dirs:
        try:
            bundle = load_bundle(directory)
        except BundleIncomplete:
            report.incomplete.append(directory)
        except BadBundle as exc:
            report.skipped.append((directory, exc.short()))
        except BundleError as exc:
            report.skipped.append((directory, str(exc)))
        except Exception as exc:  # whatever one bundle raises skips that bundle, not the ingest
            report.skipped.append((directory, f"cannot be read: {_describe(exc)}"))
        else:
            report.warnings += [(directory, text) for text in bundle.warnings]
            bundles.append(bundle)
    return bundles


def _describe(exc: BaseException) -> str:
    """An exception in one line: its message (cut) and its type."""
    if isinstance(exc, RecursionError):
        return "nested too deeply (RecursionError)"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= 200 else text[:200] + "…"
    return f"{text} ({type(exc).__name__})" if text else type(exc).__name__


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


class _Unstorable(ValueError):
    """A value of one bundle that its warehouse column cannot hold."""


def _bundle_tables(bundle: Bundle) -> dict[str, pa.Table]:
    """One bundle's rows, as one Arrow table per warehouse table, checked against the column
    types and NOT NULL constraints; ``_Unstorable`` names the table and column at fault."""
    tables = {"runs": _runs_table([bundle]), "steps": _steps_table([bundle]),
              "epochs": _epochs_table([bundle]), "monitor_samples": _samples_table([bundle]),
              "layers": _columns([bundle], "layers", LAYERS_SCHEMA)}
    for name, table in tables.items():
        for column in NOT_NULL[name]:
            if table.column(column).null_count:
                raise _Unstorable(f"{name}.{column}: a record has no value, and the column "
                                  "needs one")
    return tables


def _prepare_all(bundles: list[Bundle], report: IngestReport) -> list[tuple[Bundle, dict[str, pa.Table]]]:
    """Each bundle with its tables; a bundle whose rows cannot be built is skipped."""
    prepared = []
    for bundle in bundles:
        try:
            prepared.append((bundle, _bundle_tables(bundle)))
        except _Unstorable as exc:
            report.skipped.append((bundle.path, f"cannot be stored: {exc}"))
        except Exception as exc:  # anything else one bundle raises skips that bundle alone
            report.skipped.append((bundle.path, f"cannot be stored: {_describe(exc)}"))
    return prepared


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


def _json(value: Any, column: str) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, sort_keys=True)
    except (RecursionError, ValueError, TypeError) as exc:
        raise _Unstorable(f"runs.{column}: {_describe(exc)}") from None


def _arrow(table: str, columns: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    """An Arrow table of ``schema`` from Python column lists; ``_Unstorable`` names the column
    holding a value its type cannot (an integer out of range, a string that is not UTF-8)."""
    arrays = []
    for f in schema:
        try:
            arrays.append(pa.array(columns[f.name], type=f.type))
        except _ARROW_ERRORS as exc:
            raise _Unstorable(f"{table}.{f.name}: {_first_misfit(columns[f.name], f.type, exc)}") from None
    return pa.Table.from_arrays(arrays, schema=schema)


_ARROW_ERRORS = (pa.ArrowException, OverflowError, ValueError, TypeError)


def _first_misfit(values: list[Any], kind: pa.DataType, exc: BaseException) -> str:
    """Which value a column of type ``kind`` could not hold, for the skip reason."""
    for value in values:
        try:
            pa.array([value], type=kind)
        except _ARROW_ERRORS as one:
            text = repr(value)
            text = text if len(text) <= 60 else f"{text[:40]}… ({len(text)} characters)"
            return f"{text} does not fit its type {kind} ({type(one).__name__})"
    return _describe(exc)


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _runs_table(bundles: list[Bundle]) -> pa.Table:
    rows = []
    for b in bundles:
        result, summary = b.result, b.summary or {}
        monitor = result.get("monitor") or {}
        row = {
            "run_id": b.run_id, "sweep": b.key.sweep, "cell_id": b.key.cell_id,
            "repeat": b.key.repeat, "attempt": b.key.attempt, "env_id": result["env_id"],
            "executor": result["executor"], "status": result["status"],
            "exit_code": result.get("exit_code"), "error_tail": result.get("error_tail"),
            "started_at": _time(result["started_at"]), "ended_at": _time(result.get("ended_at")),
            "wall_seconds": result.get("wall_seconds"),
            "params": _json(b.spec["params"], "params"), "host": _json(result.get("host"), "host"),
            "probe": _json(_without_type(b.probe), "probe"), "data": _json(_without_type(b.data), "data"),
            "model": _json(_without_type(b.model), "model"),
            "summary": _json(_without_type(b.summary), "summary"),
            "monitor": _json(result.get("monitor"), "monitor"),
            "harness_version": _text(b.header.get("harness_version")),
            "mismatches": None if b.probe is None else b.probe.get("mismatches", []),
            "events_truncated": any(w.startswith(EVENTS) for w in b.warnings),
            "bundle_path": str(b.path), "bundle_digest": b.digest,
            **_image_columns(result.get("image")),
        }
        row.update({col: _number(summary.get(col), col) for col in _SUMMARY_COLUMNS})
        row.update({col: _number(monitor.get(key), col) for col, key in _MONITOR_COLUMNS.items()})
        rows.append(row)
    return _arrow("runs", {f.name: [row.get(f.name) for row in rows] for f in RUNS_SCHEMA}, RUNS_SCHEMA)


def _image_columns(image: Any) -> dict[str, str | None]:
    """The image a run used (result.json ``image``, docker executor), as three columns."""
    if not isinstance(image, dict):
        return {"image_tag": None, "image_id": None, "image_digest": None}
    digests = image.get("repo_digests")
    first = digests[0] if isinstance(digests, list) and digests and isinstance(digests[0], str) else None
    image_id = _text(image.get("id"))
    return {"image_tag": _text(image.get("tag")), "image_id": image_id, "image_digest": first or image_id}


def _without_type(record: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if record is None else {k: v for k, v in record.items() if k != "type"}


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _number(value: Any, column: str) -> Any:
    """A JSON value for a typed column, or None when it has the wrong type."""
    kind = RUNS_SCHEMA.field(column).type
    if value is None or isinstance(value, bool) != pa.types.is_boolean(kind):
        return None
    if pa.types.is_integer(kind):
        return value if isinstance(value, int) else None
    if pa.types.is_floating(kind):
        return float(value) if isinstance(value, (int, float)) else None
    return value


def _columns(bundles: list[Bundle], attr: str, schema: pa.Schema) -> pa.Table:
    """A child table: the records under ``attr`` of every bundle, tagged with run_id (``attr``
    is also the warehouse table's name)."""
    names = [f.name for f in schema if f.name != "run_id"]
    columns: dict[str, list[Any]] = {"run_id": []}
    columns.update({name: [] for name in names})
    for b in bundles:
        records = getattr(b, attr)
        columns["run_id"].extend([b.run_id] * len(records))
        for name in names:
            columns[name].extend([r.get(name) for r in records])
    return _arrow(attr, columns, schema)


def _steps_table(bundles: list[Bundle]) -> pa.Table:
    return _columns(bundles, "steps", STEPS_SCHEMA)


def _epochs_table(bundles: list[Bundle]) -> pa.Table:
    return _columns(bundles, "epochs", EPOCHS_SCHEMA)


def _samples_table(bundles: list[Bundle]) -> pa.Table:
    return _columns(bundles, "monitor_samples", SAMPLES_SCHEMA)
