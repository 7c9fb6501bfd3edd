"""A bundle's rows for the warehouse: one Arrow table per warehouse table.

Every bundle is turned into its rows on its own, outside any transaction: a value no column
can hold (an integer out of range, text that is not UTF-8, JSON nested too deep, a missing
``NOT NULL`` value) raises :class:`Unstorable` naming the table and column, and the ingest
skips that bundle alone (docs/WAREHOUSE.md "Ingest").

Steps and monitor samples come from the reader as Arrow record batches (``read.Rows``): their
tables reuse those columns and add ``run_id``, one value Arrow repeats, so a million steps
are never a million Python objects.  The few other records are Python dicts, converted here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pyarrow as pa

from matrun.warehouse.bundles.layout import EVENTS
from matrun.warehouse.bundles.read import Bundle, Rows

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
    # the GPU and energy monitor's aggregates and the machine state (migration 007)
    ("gpu_util_avg", pa.float64()), ("gpu_mem_used_peak_bytes", pa.int64()),
    ("gpu_power_avg_w", pa.float64()), ("gpu_energy_j", pa.float64()), ("gpu_throttled", pa.bool_()),
    ("cpu_energy_j", pa.float64()), ("busy_start", pa.bool_()),
    # the performance model's inputs (migration 008)
    ("gradient_bytes", pa.int64()), ("phase_every", pa.int32()),
    # an adaptive sweep's nominal level (migration 010)
    ("design_level", pa.float64()),
])
STEP_PHASES_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("step", pa.int32()), ("ordinal", pa.int32()), ("phase", pa.string()),
    ("seconds", pa.float64()), ("step_seconds", pa.float64()),
])
CALIBRATION_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("bytes", pa.int64()), ("seconds", pa.float64()),
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
GPU_SAMPLES_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("t", pa.float64()), ("gpu", pa.int32()), ("util", pa.float64()),
    ("mem_util", pa.float64()), ("mem_used_bytes", pa.int64()), ("power_w", pa.float64()),
    ("energy_j", pa.float64()), ("sm_clock_mhz", pa.int32()), ("mem_clock_mhz", pa.int32()),
    ("temp_c", pa.float64()), ("throttle", pa.int64()),
])
_SUMMARY_COLUMNS = ("train_seconds", "test_seconds", "accuracy", "throughput",
                    "time_to_first_step", "timed_steps", "warmup_steps", "diverged")
_MONITOR_COLUMNS = {"monitor_interval_s": "interval_s", "monitor_samples": "samples",
                    "cpu_user_avg": "cpu_user_avg", "cpu_system_avg": "cpu_system_avg",
                    "cpu_total_avg": "cpu_total_avg", "iowait_avg": "iowait_avg",
                    "rss_avg_bytes": "rss_avg_bytes", "rss_peak_bytes": "rss_peak_bytes",
                    **{col: col for col in ("gpu_util_avg", "gpu_mem_used_peak_bytes", "gpu_power_avg_w",
                                            "gpu_energy_j", "gpu_throttled", "cpu_energy_j")}}


#: Columns the migrations declare NOT NULL (``migrations/001_initial.sql``, ``002_layers.sql``),
#: checked per bundle before the transaction.

NOT_NULL = {
    "runs": ("run_id", "sweep", "cell_id", "repeat", "attempt", "env_id", "executor", "status",
             "started_at", "params", "events_truncated", "bundle_path", "bundle_digest"),
    "steps": ("run_id", "step", "phase", "seconds", "images"),
    "epochs": ("run_id", "epoch"),
    "monitor_samples": ("run_id", "t"),
    "gpu_samples": ("run_id", "t", "gpu"),
    "layers": ("run_id", "name", "kind"),
    "step_phases": ("run_id", "step", "ordinal", "phase", "seconds"),
    "exchange_calibration": ("run_id", "bytes", "seconds"),
}


def describe(exc: BaseException) -> str:
    """An exception in one line: its message (cut) and its type."""
    if isinstance(exc, RecursionError):
        return "nested too deeply (RecursionError)"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= 200 else text[:200] + "…"
    return f"{text} ({type(exc).__name__})" if text else type(exc).__name__


class Unstorable(ValueError):
    """A value of one bundle that its warehouse column cannot hold."""


def bundle_tables(bundle: Bundle) -> dict[str, pa.Table]:
    """One bundle's rows, as one Arrow table per warehouse table, checked against the column
    types and NOT NULL constraints; ``Unstorable`` names the table and column at fault."""
    run_id = bundle.run_id
    tables = {"runs": _runs_table([bundle]),
              "steps": _rows_table("steps", run_id, bundle.steps, STEPS_SCHEMA),
              "epochs": _records_table("epochs", run_id, bundle.epochs, EPOCHS_SCHEMA),
              "monitor_samples": _rows_table("monitor_samples", run_id, bundle.monitor_samples,
                                             SAMPLES_SCHEMA),
              "layers": _records_table("layers", run_id, bundle.layers, LAYERS_SCHEMA),
              "gpu_samples": _rows_table("gpu_samples", run_id, bundle.gpu_samples, GPU_SAMPLES_SCHEMA),
              "step_phases": _records_table("step_phases", run_id, bundle.phases, STEP_PHASES_SCHEMA),
              "exchange_calibration": _records_table("exchange_calibration", run_id,
                                                     calibration_points(bundle.summary), CALIBRATION_SCHEMA)}
    for name, table in tables.items():
        for column in NOT_NULL[name]:
            if table.column(column).null_count:
                raise Unstorable(f"{name}.{column}: a record has no value, and the column "
                                 "needs one")
    return tables


def _json(value: Any, column: str) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, sort_keys=True)
    except (RecursionError, ValueError, TypeError) as exc:
        raise Unstorable(f"runs.{column}: {describe(exc)}") from None


def _arrow(table: str, columns: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    """An Arrow table of ``schema`` from Python column lists; ``Unstorable`` names the column
    holding a value its type cannot (an integer out of range, a string that is not UTF-8)."""
    arrays = []
    for f in schema:
        try:
            arrays.append(pa.array(columns[f.name], type=f.type))
        except _ARROW_ERRORS as exc:
            raise Unstorable(f"{table}.{f.name}: {_first_misfit(columns[f.name], f.type, exc)}") from None
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
    return describe(exc)


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
        row["busy_start"] = _number(_state(result.get("host")).get("busy"), "busy_start")
        row["gradient_bytes"] = _number(summary.get("gradient_bytes"), "gradient_bytes")
        row["design_level"] = _design_level(result.get("design"))
        phases = summary.get("phases")
        row["phase_every"] = _number(phases.get("every"), "phase_every") if isinstance(phases, dict) else None
        rows.append(row)
    return _arrow("runs", {f.name: [row.get(f.name) for row in rows] for f in RUNS_SCHEMA}, RUNS_SCHEMA)


def calibration_points(summary: dict[str, Any] | None) -> list[dict[str, Any]]:
    """summary.exchange.calibration.points as rows: each a [bytes, seconds] pair of a
    positive integer and a finite number >= 0; anything else in the list is left out (the
    summary keeps it as written)."""
    exchange = (summary or {}).get("exchange")
    calibration = exchange.get("calibration") if isinstance(exchange, dict) else None
    points = calibration.get("points") if isinstance(calibration, dict) else None
    rows = []
    for point in points if isinstance(points, list) else ():
        if (isinstance(point, list) and len(point) == 2 and isinstance(point[0], int)
                and not isinstance(point[0], bool) and 0 < point[0] < 2**63
                and isinstance(point[1], (int, float)) and not isinstance(point[1], bool)
                and point[1] >= 0 and point[1] != float("inf")):
            rows.append({"bytes": point[0], "seconds": float(point[1])})
    return rows


def _image_columns(image: Any) -> dict[str, str | None]:
    """The image a run used (result.json ``image``, docker executor), as three columns."""
    if not isinstance(image, dict):
        return {"image_tag": None, "image_id": None, "image_digest": None}
    digests = image.get("repo_digests")
    first = digests[0] if isinstance(digests, list) and digests and isinstance(digests[0], str) else None
    image_id = _text(image.get("id"))
    return {"image_tag": _text(image.get("tag")), "image_id": image_id, "image_digest": first or image_id}


def _state(host: Any) -> dict[str, Any]:
    """result.json ``host.state``: the machine state before the run (runner/sweep/machine.py)."""
    state = host.get("state") if isinstance(host, dict) else None
    return state if isinstance(state, dict) else {}


def _without_type(record: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if record is None else {k: v for k, v in record.items() if k != "type"}


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _design_level(design: Any) -> float | None:
    """result.json ``design.level`` of a run of an adaptive sweep (runner/planning/sequential.py):
    a level in (0, 0.05]; anything else (a fixed design, a damaged or hostile value) is None,
    which the verdicts read as 0.05 - a bundle cannot make its comparisons easier to win."""
    level = _number(design.get("level"), "design_level") if isinstance(design, dict) else None
    return level if level is not None and 0 < level <= 0.05 else None


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


def _records_table(table: str, run_id: str, records: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """A child table from records (dicts), each tagged with ``run_id``."""
    columns: dict[str, list[Any]] = {"run_id": [run_id] * len(records)}
    columns.update({f.name: [r.get(f.name) for r in records] for f in schema if f.name != "run_id"})
    return _arrow(table, columns, schema)


def _rows_table(table: str, run_id: str, rows: Rows, schema: pa.Schema) -> pa.Table:
    """A child table from records read in bulk: their batches, or records where a batch could
    not hold them, in order."""
    parts = [_records_table(table, run_id, chunk, schema) if isinstance(chunk, list)
             else _batch_table(table, run_id, chunk, schema) for chunk in rows]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _batch_table(table: str, run_id: str, batch: pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """A record batch as a table of ``schema``: ``run_id`` added (one value, repeated by
    Arrow), each column kept as it is or cast to its type."""
    arrays = []
    for f in schema:
        try:
            if f.name == "run_id":
                arrays.append(pa.repeat(pa.scalar(run_id, f.type), batch.num_rows))
                continue
            column = batch.column(f.name)
            arrays.append(column if column.type == f.type else column.cast(f.type))
        except _ARROW_ERRORS as exc:
            values = [run_id] if f.name == "run_id" else batch.column(f.name).to_pylist()
            raise Unstorable(f"{table}.{f.name}: {_first_misfit(values, f.type, exc)}") from None
    return pa.Table.from_arrays(arrays, schema=schema)
