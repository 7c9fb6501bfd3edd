"""Pure shaping of the warehouse's rows for the report: labels, run choice, provenance.

Polars in, Polars (or plain values) out; no I/O.  Cell labels: a cell id is a hash, a
reader wants ``torch · threads=2``, so a label is built from the parameters whose values
differ between the cells shown (a thread sweep is labelled by threads, a framework
comparison by framework).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

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


# Above this many varying parameters a label names only what differs from the common value.
MAX_FULL_LABEL_PARAMS = 4


def label_parts(rows: Sequence[Mapping[str, Any]], params: Sequence[str],
                always: Sequence[str] = ()) -> list[list[str]]:
    """Per row, the parts of its label over ``params`` (the parameters that vary).

    With few varying parameters every one is shown (``threads=2 · batch_size=64``).  With
    more than ``MAX_FULL_LABEL_PARAMS`` a label shows a parameter only where its value is
    not the most common one, so a broad sweep reads ``threads=4`` rather than thirteen
    parameters; ``always`` (and framework, model, dataset when they vary) stay.  A null
    value (a parameter the cell does not use: ``gpus`` on a CPU cell) is never shown, and
    counts as the common value of a parameter that some rows leave null.  Two rows with
    different values still get different labels: wherever they differ, at least one of
    them has a value that is neither null nor the common one, and shows it.
    """
    compact = len(params) > MAX_FULL_LABEL_PARAMS
    common: dict[str, str | None] = {}
    if compact:
        for p in params:
            values = [r.get(p) for r in rows]
            texts = [_value(v) for v in values if v is not None]
            common[p] = None if len(texts) < len(values) else max(dict.fromkeys(texts), key=texts.count)
    out = []
    for r in rows:
        parts = []
        for p in params:
            if r.get(p) is None:
                continue
            shown = _value(r.get(p))
            if compact and p not in _BARE and p not in always and shown == common[p]:
                continue
            parts.append(shown if p in _BARE else f"{p}={shown}")
        out.append(parts)
    return out


def _unique(labels: list[str], keys: Sequence[Any], width: int) -> list[str]:
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return [f"{lab} ({str(k)[:width]})" if counts[lab] > 1 else lab for lab, k in zip(labels, keys)]


def cell_labels(runs: pl.DataFrame) -> pl.DataFrame:
    """One row per (sweep, cell_id) with ``label``, from run_overview-shaped rows.

    When the report covers more than one sweep the sweep name leads the label.  Two cells
    whose shown parameters are equal (they differ in environment only, say) get their cell
    id's first eight characters appended so no two cells share a label.  Past
    ``MAX_FULL_LABEL_PARAMS`` varying parameters, see ``label_parts``.
    """
    if runs.is_empty():
        return pl.DataFrame(schema={"sweep": pl.String, "cell_id": pl.String, "label": pl.String})
    cells = runs.unique(subset=["sweep", "cell_id"], keep="first", maintain_order=True)
    params = varying_params(cells)
    many_sweeps = cells.get_column("sweep").n_unique() > 1
    rows = cells.to_dicts()
    labels: list[str] = []
    for row, parts in zip(rows, label_parts(rows, params)):
        if many_sweeps:
            parts.insert(0, f"[{row['sweep']}]")
        labels.append(" · ".join(parts) or " · ".join(_value(row.get(p)) for p in DEFAULT_PARAMS))
    ids = cells.get_column("cell_id").to_list()
    return pl.DataFrame(
        {"sweep": cells.get_column("sweep"), "cell_id": ids, "label": _unique(labels, ids, 8)},
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
_ENV_COLUMNS = ("framework", "framework_version", "env_id", "executor", "image_tag", "image_blas",
                "image_onednn", "build")


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


# --- labels for the study views' configurations and cells --------------------------------

# Columns of the study views that may name a configuration or a cell, in the order shown.
STUDY_PARAMS: tuple[str, ...] = (
    "framework", "variant", "blas", "model", "dataset", "device", "mode", "gpus", "workers",
    "threads", "onednn", "batch_size", "epochs", "iterations", "optimizer", "lr", "layout",
    "precision", "unit",
)


def row_labels(
    frame: pl.DataFrame, *, key: str = "cell_id", exclude: Sequence[str] = (),
    lead: Sequence[str] = ("framework",),
) -> dict[Any, str]:
    """A label per distinct ``key`` of ``frame``: ``lead`` columns, then those that vary.

    A configuration (``key="config"``) is labelled by what differs between the
    configurations shown, less ``exclude`` (the view's axes, which label the points inside
    it); a cell by what differs between the cells (compacted as ``label_parts`` says).
    Two keys with the same label get the key's first six characters appended.
    """
    if frame.is_empty() or key not in frame.columns:
        return {}
    first = frame.unique(subset=[key], keep="first", maintain_order=True)
    candidates = [c for c in STUDY_PARAMS if c in first.columns and c not in exclude]
    varying = [c for c in candidates
               if first.get_column(c).cast(pl.String).n_unique() > 1 and c not in lead]
    rows = first.to_dicts()
    leads = [c for c in lead if c in first.columns]
    labels = []
    for row, parts in zip(rows, label_parts(rows, varying)):
        shown = [_value(row[c]) if c in _BARE else f"{c}={_value(row[c])}" for c in leads] + parts
        if len(shown) <= len(leads):
            shown += [_value(row[c]) for c in ("model", "dataset") if c in row and c not in varying]
        labels.append(" · ".join(shown) or str(row[key]))
    keys = [row[key] for row in rows]
    return dict(zip(keys, _unique(labels, keys, 6)))


def thread_text(value: Any) -> str:
    """A thread setting as text (``-`` when missing)."""
    return "-" if value is None else str(value)


def thread_order(values: Sequence[Any]) -> list[str]:
    """Thread settings as text, numbers ascending, then anything else (``unset``) last."""
    texts = list(dict.fromkeys(thread_text(v) for v in values))
    numeric = sorted((t for t in texts if t.isdigit()), key=int)
    return numeric + [t for t in texts if not t.isdigit()]


# --- publishing: no path of this machine leaves it ---------------------------------------

# An absolute POSIX path with at least one directory, not part of a URL or a relative path.
_ABS_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^\s/\"'<>|:;,()\[\]{}]+/)+([^\s/\"'<>|:;,()\[\]{}]*)")


def mask_paths(text: str) -> str:
    """``text`` with every absolute path cut to ``…/<last part>``: /home/a/x.py -> …/x.py."""
    return _ABS_PATH.sub(lambda m: f"…/{m.group(1)}", text)


def mask_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """Every text value of ``frame`` (and every text in a list column) through ``mask_paths``."""
    exprs = []
    for name, dtype in frame.schema.items():
        if dtype == pl.String:
            exprs.append(pl.col(name).map_elements(mask_paths, return_dtype=pl.String))
        elif dtype == pl.List(pl.String):
            exprs.append(pl.col(name).list.eval(
                pl.element().map_elements(mask_paths, return_dtype=pl.String)))
    return frame.with_columns(exprs) if exprs and not frame.is_empty() else frame
