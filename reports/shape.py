"""Pure shaping of the warehouse's rows for the report: labels, run choice, provenance.

Polars in, Polars (or plain values) out; no I/O.  Cell labels: a cell id is a hash, a
reader wants ``torch · threads=2``, so a label is built from the parameters whose values
differ between the cells shown (a thread sweep is labelled by threads, a framework
comparison by framework).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Sequence

import polars as pl

from matrun.errors import InputError

# The run_overview parameter columns a label may use, in the order they are shown.
LABEL_PARAMS: tuple[str, ...] = (
    "framework", "variant", "model", "dataset", "device", "gpus", "mode", "threads",
    "interop_threads", "batch_size", "epochs", "iterations", "optimizer", "lr", "onednn",
    "layout", "precision", "conv_algo", "preset", "cpuset", "seed",
)
# What a label shows when nothing varies (a single cell).
DEFAULT_PARAMS: tuple[str, ...] = ("framework", "model", "dataset")
# Parameters whose value alone reads well; the others are shown as key=value.
_BARE = frozenset({"framework", "model", "dataset"})


def varying_params(cells: pl.DataFrame) -> list[str]:
    """The label parameters that take more than one value across ``cells``."""
    present = [c for c in LABEL_PARAMS if c in cells.columns]
    varying = [c for c in present if cells.get_column(c).cast(pl.String).n_unique() > 1]
    return varying or [c for c in DEFAULT_PARAMS if c in cells.columns]


def _value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def cell_labels(runs: pl.DataFrame) -> pl.DataFrame:
    """One row per (sweep, cell_id) with ``label``, from run_overview-shaped rows.

    When the report covers more than one sweep the sweep name leads the label.  Two cells
    whose shown parameters are equal (they differ in environment only, say) get their cell
    id's first eight characters appended so no two cells share a label.
    """
    if runs.is_empty():
        return pl.DataFrame(schema={"sweep": pl.String, "cell_id": pl.String, "label": pl.String})
    cells = runs.unique(subset=["sweep", "cell_id"], keep="first", maintain_order=True)
    params = varying_params(cells)
    many_sweeps = cells.get_column("sweep").n_unique() > 1
    labels: list[str] = []
    for row in cells.iter_rows(named=True):
        parts = [
            _value(row[p]) if p in _BARE else f"{p}={_value(row[p])}" for p in params
        ]
        if many_sweeps:
            parts.insert(0, f"[{row['sweep']}]")
        labels.append(" · ".join(parts))
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    ids = cells.get_column("cell_id").to_list()
    labels = [f"{lab} ({cid[:8]})" if counts[lab] > 1 else lab for lab, cid in zip(labels, ids)]
    return pl.DataFrame(
        {"sweep": cells.get_column("sweep"), "cell_id": ids, "label": labels},
        schema={"sweep": pl.String, "cell_id": pl.String, "label": pl.String},
    )


# --- which runs the time-series figure shows --------------------------------------------


def choose_run(runs: pl.DataFrame, run_id: str | None) -> str | None:
    """The run whose monitor samples are shown first.

    ``run_id`` when given (it must be one of ``runs``); otherwise the latest ok run, or the
    latest run of any status when none succeeded; None when there are no runs.
    """
    if run_id is not None:
        if run_id not in set(runs.get_column("run_id").to_list()):
            known = runs.get_column("run_id").to_list()
            hint = ", ".join(known[-5:]) if known else "there are no runs"
            raise InputError(
                f"run {run_id!r} is not in the report's runs (latest: {hint}); list them "
                "with: matrun query \"SELECT run_id, sweep, status FROM run_overview\""
            )
        return run_id
    if runs.is_empty():
        return None
    latest = runs.sort(["started_at", "run_id"], nulls_last=False)
    ok = latest.filter(pl.col("status") == "ok")
    return (ok if not ok.is_empty() else latest).get_column("run_id").to_list()[-1]


def monitor_runs(runs: pl.DataFrame, selected: str | None, *, limit: int = 20) -> list[str]:
    """The runs whose time series the figure embeds: ``selected`` plus the latest others."""
    if selected is None:
        return []
    others = (
        runs.filter(pl.col("run_id") != selected)
        .sort(["started_at", "run_id"], descending=True, nulls_last=True)
        .get_column("run_id")
        .to_list()
    )
    return [selected, *others[: max(0, limit - 1)]]


# --- provenance ------------------------------------------------------------------------


def parse_json(value: Any) -> Any:
    """A JSON column's value as Python (DuckDB hands JSON over as text); bad text as is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def mismatch_list(value: Any) -> list[str]:
    """A mismatches column (JSON list, list, or None) as a list of strings."""
    parsed = parse_json(value)
    if parsed is None or parsed == "":
        return []
    if isinstance(parsed, list):
        return [str(m) for m in parsed]
    return [str(parsed)]


_HOST_COLUMNS = ("hostname", "cpu_model", "cpu_count", "os", "python", "matrun_version")
_ENV_COLUMNS = ("framework", "framework_version", "env_id", "executor", "build")


def _grouped(provenance: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    present = [c for c in columns if c in provenance.columns]
    return (
        provenance.group_by(present, maintain_order=True)
        .agg(pl.len().alias("runs"))
        .sort(present, nulls_last=True)
    )


def hosts_summary(provenance: pl.DataFrame) -> pl.DataFrame:
    """Distinct (host, CPU, OS, Python, matrun version) with how many runs each."""
    return _grouped(provenance, _HOST_COLUMNS)


def environments_summary(provenance: pl.DataFrame) -> pl.DataFrame:
    """Distinct (framework, version, environment, executor, build) with run counts."""
    return _grouped(provenance, _ENV_COLUMNS)


@dataclass(frozen=True)
class InForce:
    """What one group of a cell's runs had in force, as reported by the harness probe."""

    sweep: str
    cell_id: str
    label: str
    asked_threads: str
    asked_onednn: str
    in_force: dict[str, Any]
    libraries: list[dict[str, Any]]
    mismatches: list[str]
    runs: int


def in_force_summary(provenance: pl.DataFrame, runs: pl.DataFrame) -> list[InForce]:
    """Per cell, each distinct (in force, libraries, mismatches) with its number of runs.

    ``runs`` supplies what was asked (threads, oneDNN) and the cell labels.
    """
    labels = {(r["sweep"], r["cell_id"]): r["label"] for r in cell_labels(runs).iter_rows(named=True)}
    asked = {
        (r["sweep"], r["cell_id"]): r
        for r in runs.unique(subset=["sweep", "cell_id"], keep="first").iter_rows(named=True)
    }
    groups: dict[tuple[str, str, str, str, str], InForce] = {}
    for row in provenance.iter_rows(named=True):
        key = (row["sweep"], row["cell_id"])
        in_force = parse_json(row.get("in_force"))
        libraries = parse_json(row.get("libraries"))
        mismatches = mismatch_list(row.get("mismatches"))
        fingerprint = (
            *key,
            json.dumps(in_force, sort_keys=True, default=str),
            json.dumps(libraries, sort_keys=True, default=str),
            json.dumps(mismatches),
        )
        found = groups.get(fingerprint)
        if found is not None:
            groups[fingerprint] = replace(found, runs=found.runs + 1)
            continue
        ask = asked.get(key, {})
        groups[fingerprint] = InForce(
            sweep=row["sweep"],
            cell_id=row["cell_id"],
            label=labels.get(key, row["cell_id"]),
            asked_threads=str(ask.get("threads", "-")),
            asked_onednn=str(ask.get("onednn", "-")),
            in_force=in_force if isinstance(in_force, dict) else {"value": in_force},
            libraries=[lib for lib in libraries if isinstance(lib, dict)]
            if isinstance(libraries, list) else [],
            mismatches=mismatches,
            runs=1,
        )
    return list(groups.values())
