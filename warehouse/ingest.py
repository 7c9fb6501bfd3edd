"""Loading result bundles into the warehouse: idempotent, transactional, bulk.

Every bundle is parsed and validated first, outside any transaction; then all new runs
and their steps, epochs and monitor samples go in with one transaction, as Arrow tables
(one INSERT per table, not one per row).  If anything fails inside it, it rolls back and
the warehouse is as it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Sequence

import duckdb
import pyarrow as pa

from matrun.errors import BundleError, InputError, WarehouseError
from matrun.warehouse.bundles.layout import EVENTS
from matrun.warehouse.bundles.read import BadBundle, Bundle, BundleIncomplete, find_bundles, load_bundle
from matrun.warehouse.db import open_warehouse

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


@dataclass
class IngestReport:
    """What one ingest did, bundle by bundle (paths are bundle directories)."""

    ingested: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    incomplete: list[Path] = field(default_factory=list)
    warnings: list[tuple[Path, str]] = field(default_factory=list)

    def summary(self) -> str:
        """One line of counts; the reasons are in ``skipped`` and ``warnings``."""
        return (f"ingested {len(self.ingested)} run(s), {len(self.unchanged)} unchanged, "
                f"{len(self.skipped)} skipped, {len(self.incomplete)} incomplete")


def ingest(paths: Iterable[Path | str], *, warehouse: Path | str,
           wait_s: float = 0.0) -> IngestReport:
    """Load every bundle under ``paths`` into ``warehouse``; see the module docstring."""
    report = IngestReport()
    bundles = _load_all(_bundle_dirs(paths), report)
    with open_warehouse(warehouse, wait_s=wait_s) as wh:
        new = _select_new(wh.con, bundles, report)
        if new:
            _insert_all(wh.con, wh.path, new)
    report.ingested = [b.path for b in new]
    return report


def _bundle_dirs(paths: Iterable[Path | str]) -> list[Path]:
    roots = [Path(p) for p in paths]
    for root in roots:
        if not root.is_dir():
            raise InputError(f"{root}: no such directory; give a results directory or a bundle")
    seen: set[Path] = set()
    dirs = []
    for root in roots:
        for directory in find_bundles(root):
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
        else:
            report.warnings += [(directory, text) for text in bundle.warnings]
            bundles.append(bundle)
    return bundles


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


def _insert_all(con: duckdb.DuckDBPyConnection, path: Path, bundles: list[Bundle]) -> None:
    tables = {"runs": _runs_table(bundles), "steps": _steps_table(bundles),
              "epochs": _epochs_table(bundles), "monitor_samples": _samples_table(bundles),
              "layers": _columns(bundles, "layers", LAYERS_SCHEMA)}
    con.execute("BEGIN TRANSACTION")
    try:
        for name, table in tables.items():
            _insert_table(con, name, table)
        con.execute("COMMIT")
    except duckdb.Error as exc:
        con.execute("ROLLBACK")
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WarehouseError(f"ingest into warehouse {path} failed and was rolled back, "
                             f"nothing was written: {message}") from None
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _insert_table(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
    """Bulk-insert an Arrow table into the warehouse table of the same column names."""
    if table.num_rows == 0:
        return
    con.register("_matrun_new_rows", table)
    try:
        con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _matrun_new_rows")
    finally:
        con.unregister("_matrun_new_rows")


# -- Arrow tables ------------------------------------------------------------------------


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


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
            "params": _json(b.spec["params"]), "host": _json(result.get("host")),
            "probe": _json(_without_type(b.probe)), "data": _json(_without_type(b.data)),
            "model": _json(_without_type(b.model)), "summary": _json(_without_type(b.summary)),
            "monitor": _json(result.get("monitor")),
            "harness_version": _text(b.header.get("harness_version")),
            "mismatches": None if b.probe is None else b.probe.get("mismatches", []),
            "events_truncated": any(w.startswith(EVENTS) for w in b.warnings),
            "bundle_path": str(b.path), "bundle_digest": b.digest,
            **_image_columns(result.get("image")),
        }
        row.update({col: _number(summary.get(col), col) for col in _SUMMARY_COLUMNS})
        row.update({col: _number(monitor.get(key), col) for col, key in _MONITOR_COLUMNS.items()})
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=RUNS_SCHEMA)


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
    """A child table: the records under ``attr`` of every bundle, tagged with run_id."""
    names = [f.name for f in schema if f.name != "run_id"]
    columns: dict[str, list[Any]] = {"run_id": []}
    columns.update({name: [] for name in names})
    for b in bundles:
        records = getattr(b, attr)
        columns["run_id"].extend([b.run_id] * len(records))
        for name in names:
            columns[name].extend([r.get(name) for r in records])
    return pa.table({name: pa.array(values, type=schema.field(name).type)
                     for name, values in columns.items()}, schema=schema)


def _steps_table(bundles: list[Bundle]) -> pa.Table:
    return _columns(bundles, "steps", STEPS_SCHEMA)


def _epochs_table(bundles: list[Bundle]) -> pa.Table:
    return _columns(bundles, "epochs", EPOCHS_SCHEMA)


def _samples_table(bundles: list[Bundle]) -> pa.Table:
    return _columns(bundles, "monitor_samples", SAMPLES_SCHEMA)
