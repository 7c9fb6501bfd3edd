"""The tunings of ``matrun tune`` in the warehouse (migration 012: ``tunings``,
``tuning_trials``; docs/TUNE.md).  A trial row is written, in its own transaction, as soon as
the trial is decided, so a tuning stopped at any point (Ctrl-C, kill -9) resumes from what is
here; the tuning's own row (status, budget, summary) is replaced as the search goes.  The runs
behind the trials are ordinary runs in ``runs``.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import duckdb

from matrun.warehouse.db import open_warehouse, rollback, rolled_back

TUNING_COLUMNS = ("tuning", "matrix", "sweep", "objective", "direction", "accuracy_within", "sampler", "seed",
                  "space", "status", "budget", "summary", "started_at", "updated_at")
TRIAL_COLUMNS = ("tuning", "trial", "kind", "framework", "params", "label", "cell_id", "state", "value",
                 "accuracy", "runs", "seconds", "reason", "decided_at")
JSON_COLUMNS = {"space", "budget", "summary", "params"}


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _cell(column: str, value: Any) -> Any:
    if column in JSON_COLUMNS:
        return None if value is None else json.dumps(value, sort_keys=True, allow_nan=False, default=str)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _write(path: Path, what: str, statements: list[tuple[str, list[Any]]]) -> None:
    with open_warehouse(path, wait_s=60) as wh:
        con = wh.con
        con.execute("BEGIN TRANSACTION")
        try:
            for sql, params in statements:
                con.execute(sql, params)
            con.execute("COMMIT")
        except duckdb.Error as exc:
            rollback(con)
            raise rolled_back(exc, f"recording {what}", "run matrun tune again (it resumes)") from None
        except BaseException:
            rollback(con)
            raise


def save_tuning(path: Path, row: Mapping[str, Any]) -> None:
    """Replace the tuning's row (``TUNING_COLUMNS``; ``started_at`` kept from the first)."""
    values = dict(row)
    values.setdefault("started_at", _now())
    values["updated_at"] = _now()
    cols = ", ".join(f'"{c}"' for c in TUNING_COLUMNS)
    _write(path, f"tuning {row['tuning']}", [
        ("DELETE FROM tunings WHERE tuning = ?", [row["tuning"]]),
        (f"INSERT INTO tunings ({cols}) VALUES ({', '.join('?' * len(TUNING_COLUMNS))})",
         [_cell(c, values.get(c)) for c in TUNING_COLUMNS]),
    ])


def add_trial(path: Path, tuning: str, trial: Mapping[str, Any]) -> None:
    """Write one decided trial (``TRIAL_COLUMNS`` less ``tuning`` and ``decided_at``)."""
    values = {**trial, "tuning": tuning, "decided_at": _now()}
    cols = ", ".join(f'"{c}"' for c in TRIAL_COLUMNS)
    _write(path, f"trial {trial['trial']} of tuning {tuning}", [
        (f"INSERT INTO tuning_trials ({cols}) VALUES ({', '.join('?' * len(TRIAL_COLUMNS))})",
         [_cell(c, values.get(c)) for c in TRIAL_COLUMNS]),
    ])


def _rows(cur: Any) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    out = []
    for r in cur.fetchall():
        row = dict(zip(names, r))
        for c in JSON_COLUMNS & set(row):
            if isinstance(row[c], str):
                row[c] = json.loads(row[c])
        out.append(row)
    return out


def read_tunings(con: Any, tuning: str | None = None) -> list[dict[str, Any]]:
    """The tunings (newest first), each with its ``trials`` in order, from an open connection."""
    where, params = ("WHERE tuning = ?", [tuning]) if tuning else ("", [])
    try:
        con.execute("SELECT 1 FROM tunings LIMIT 0")
    except duckdb.CatalogException:  # a warehouse no writer has migrated to 012 yet: no tuning
        return []
    tunings = _rows(con.execute(f"SELECT * FROM tunings {where} ORDER BY started_at DESC, tuning", params))
    for t in tunings:
        t["trials"] = _rows(con.execute("SELECT * EXCLUDE (tuning) FROM tuning_trials WHERE tuning = ? "
                                        "ORDER BY trial", [t["tuning"]]))
    return tunings
