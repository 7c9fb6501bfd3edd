"""A study's declaration — what its paper reported and how the warehouse checks it — and its
registration in the warehouse (docs/WAREHOUSE.md, "Studies and findings").

A study file is a matrix file with more sections (docs/MATRIX.md): ``[study]`` (id, title,
the seed file and the paper's table), ``[[findings]]`` (each a claim, its citation and a check
of one of ``CHECKS``' kinds with that kind's keys) and ``[paper]`` (the paper's own numbers).
:func:`parse_study` validates them strictly, every problem reported through the matrix
parser's ``add(key path, message)``; :func:`register_study` writes a declaration and the
cells a profile of the study plans into the tables of migration 004, which the ``findings``
view (``views/findings.sql``) turns into verdicts.

Pure but for :func:`register_study`; imports the harness's parameter declaration only.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any, Callable, Collection, Mapping, Sequence

import duckdb

from matrun.errors import InputError
from matrun.runner.harness.spec import PARAMS as _SPEC_PARAMS  # the cell parameters, declared once
from matrun.warehouse import materialise
from matrun.warehouse.db import rollback, rolled_back, view_sql

Add = Callable[[tuple[Any, ...], str], None]

#: ``[study] id``: a study of the catalogue (A6, D-engine, A5-blas) or a lowercase name (demo).
STUDY_ID = re.compile(r"^(?:[A-E][0-9]{0,2}(?:-[a-z0-9][a-z0-9-]{0,39})?|[a-z][a-z0-9-]{0,31})\Z")
FINDING_ID = re.compile(r"^[a-z][a-z0-9-]{0,47}\Z")
#: ``[study] seed``: a file name (of ../shared/seeds; not checked to exist).
SEED_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
LAYER_KIND = re.compile(r"^[a-z][a-z0-9_]{0,31}\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

NEEDS = ("cpu", "gpu")
MAX_GPUS = 64
#: Metrics a check may name: each has a per-run values list in the ``findings`` view.
METRICS = ("train_s", "test_s", "accuracy", "throughput", "epoch_s", "rss_peak_mb", "cpu_total",
           "device_memory_peak_mb", "step_s", "tokens_per_second", "perplexity")
LARGER_IS_BETTER = ("throughput", "accuracy", "tokens_per_second")
#: A metric ``share:<kind>``: that layer kind's share of a run's layer-profile time
#: (forward + backward summed over the kind's layers, over every layer's), per ok run.
SHARE_PREFIX = "share:"


def is_metric(value: Any) -> bool:
    """One of ``METRICS`` or ``share:<layer kind>``."""
    if not isinstance(value, str):
        return False
    if value.startswith(SHARE_PREFIX):
        return bool(LAYER_KIND.match(value[len(SHARE_PREFIX):]))
    return value in METRICS
EXPECT_TREND = ("increases", "decreases")
EXPECT_OPTION = ("increases", "decreases", "differs")
MAX_TEXT = 2_000
MAX_FINDINGS = 100
MAX_PAPER_ROWS = 1_000
MAX_PAPER_COLUMNS = 50
MAX_ALONG = 8
_MAX_INT = 2**53  # exact in JSON readers that hold numbers as doubles
#: The profile a study's base matrix (no profile applied) is registered under.  Profile names
#: start with a letter (docs/MATRIX.md), so it never collides with one.
BASE_PROFILE = "(base)"

_REQUIRED = object()  # a check key without a default

#: Each check kind's own keys and their defaults (``_REQUIRED``: must be given).  Every key
#: but ``kind`` is optional where a default is shown; ``along`` (parameters that vary
#: together with x, e.g. zipped with it) and ``ref`` of ``bounded`` are matrun's additions.
CHECKS: dict[str, dict[str, Any]] = {
    "proportional": {"x": "epochs", "metric": "train_s", "tolerance": 0.2, "along": (), "where": None},
    "trend": {"x": _REQUIRED, "metric": _REQUIRED, "expect": _REQUIRED, "along": (), "where": None},
    "oversubscription": {"x": "threads", "metric": "throughput", "along": (), "where": None},
    "spread": {"x": _REQUIRED, "metric": "train_s", "at_least": 1.5, "along": (), "where": None},
    "bounded": {"x": _REQUIRED, "metric": "accuracy", "at_most": 1.0, "ref": None, "along": (), "where": None},
    "option": {"x": _REQUIRED, "value": _REQUIRED, "ref": _REQUIRED, "metric": _REQUIRED,
               "expect": _REQUIRED, "about": None, "tolerance": 0.1, "along": (), "where": None},
    "largest_share": {"kind": "conv", "where": None},
    "sublinear": {"x": "workers", "metric": "throughput", "along": (), "where": None},
}
FINDING_KEYS = ("id", "claim", "cite", "check")
STUDY_KEYS = ("id", "title", "seed", "source", "needs", "gpus", "view")
PAPER_KEYS = ("source", "note", "x", "metric", "columns", "rows")


@dataclass(frozen=True)
class Finding:
    """One thing the paper reported: ``claim`` (a sentence), ``cite`` (where), ``check`` (a
    kind of ``CHECKS``) and ``options`` (that kind's keys, defaults filled in)."""

    id: str
    claim: str
    cite: str
    check: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class PaperTable:
    """The paper's own numbers, transcribed from the seed: ``rows`` line up with ``columns``;
    ``x`` names the cell parameter and ``metric`` the host metric they compare with (each a
    column, or None)."""

    source: str
    note: str
    x: str | None
    metric: str | None
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class StudyDecl:
    id: str
    title: str
    seed: str
    source: str
    needs: str
    gpus: int
    view: str | None
    findings: tuple[Finding, ...]
    paper: PaperTable | None

    def paper_json(self) -> str | None:
        """``paper`` as the JSON the ``studies`` table holds (None without one)."""
        if self.paper is None:
            return None
        p = self.paper
        return json.dumps({"source": p.source, "note": p.note, "x": p.x, "metric": p.metric,
                           "columns": list(p.columns), "rows": [list(r) for r in p.rows]},
                          allow_nan=False)


# -- parsing -------------------------------------------------------------------------------


def parse_study(doc: Mapping[str, Any], add: Add, *,
                param_names: Collection[str] | None = None) -> StudyDecl | None:
    """``[study]``, ``[[findings]]`` and ``[paper]`` of a matrix document (parsed TOML).

    Every problem goes to ``add(key path, message)``.  Returns None for a plain matrix (no
    ``[study]``) and whenever a problem was found.  ``param_names``: the cell parameters an
    ``x`` may name (default: the harness's declaration, ``runner/harness/spec.py``).
    """
    problems = 0

    def report(where: tuple[Any, ...], message: str) -> None:
        nonlocal problems
        problems += 1
        add(where, message)

    names = frozenset(_SPEC_PARAMS if param_names is None else param_names)
    raw = doc.get("study")
    if raw is None:
        for section in ("findings", "paper"):
            if section in doc:
                report((section,), "needs a [study] section: findings and the paper's numbers "
                                   "belong to a study (docs/MATRIX.md)")
        return None
    study = _parse_study_table(raw, report)
    findings = _parse_findings(doc.get("findings"), report, names)
    paper = _parse_paper(doc["paper"], report, names) if "paper" in doc else None
    if problems or study is None:
        return None
    return StudyDecl(**study, findings=findings, paper=paper)


def _parse_study_table(raw: Any, report: Add) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        report(("study",), f"expected a table, got {_show(raw)}")
        return None
    out: dict[str, Any] = {"seed": "", "source": "", "needs": "cpu", "view": None}
    for key, value in raw.items():
        where = ("study", key)
        if key == "id":
            if not isinstance(value, str) or not STUDY_ID.match(value):
                report(where, "expected a study id: a letter A-E, up to two digits and an optional "
                              "-suffix (A6, D-engine, A5-blas), or a lowercase name (demo); got "
                              f"{_show(value)}")
            else:
                out["id"] = value
        elif key in ("title", "source"):
            text = _text(where, value, report, empty=key != "title")
            if text is not None:
                out[key] = text
        elif key == "seed":
            if not isinstance(value, str) or not SEED_FILE.match(value):
                report(where, "expected the seed's file name (letters, digits, '.', '_', '-'; "
                              f"no directories), got {_show(value)}")
            else:
                out["seed"] = value
        elif key == "needs":
            if value not in NEEDS:
                report(where, f"expected one of {', '.join(NEEDS)}, got {_show(value)}")
            else:
                out["needs"] = value
        elif key == "gpus":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPUS:
                report(where, f"expected a GPU count from 0 to {MAX_GPUS}, got {_show(value)}")
            else:
                out["gpus"] = value
        elif key == "view":
            known = [name for name in view_sql() if name != "findings"]
            if not isinstance(value, str) or value not in known:
                report(where, f"expected the name of a warehouse view, got {_show(value)}; "
                              f"known: {', '.join(known)}")
            else:
                out["view"] = value
        else:
            report(where, f"unknown key; expected one of {', '.join(STUDY_KEYS)}")
    for key in ("id", "title"):
        if key not in raw:
            report(("study",), f"is missing required key '{key}'")
    if "gpus" not in out:
        out["gpus"] = 1 if out["needs"] == "gpu" else 0
    elif out["needs"] == "cpu" and out["gpus"] > 0:
        report(("study", "gpus"), f"is {out['gpus']} but needs = \"cpu\"; a study whose cells "
                                  "use GPUs says needs = \"gpu\"")
    elif out["needs"] == "gpu" and out["gpus"] == 0:
        report(("study", "gpus"), "is 0 but needs = \"gpu\": give the most GPUs a cell uses")
    return out if "id" in out and "title" in out else None


def _parse_findings(raw: Any, report: Add, names: frozenset[str]) -> tuple[Finding, ...]:
    if raw is None:
        report(("findings",), "a study needs at least one [[findings]] table: what its paper "
                              "reported, and the check of it")
        return ()
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        report(("findings",), "expected [[findings]] tables (id, claim, cite, check and the "
                              "check's keys)")
        return ()
    if not raw:
        report(("findings",), "is empty: a study needs at least one finding")
        return ()
    if len(raw) > MAX_FINDINGS:
        report(("findings",), f"has {len(raw):,} findings; at most {MAX_FINDINGS}")
        return ()
    found: list[Finding] = []
    seen: set[str] = set()
    for n, table in enumerate(raw):
        finding = _parse_finding(n, table, report, names)
        if finding is None:
            continue
        if finding.id in seen:
            report(("findings", n, "id"), f"{_show(finding.id)} is the id of an earlier finding; "
                                          "ids are unique in a study")
            continue
        seen.add(finding.id)
        found.append(finding)
    return tuple(found)


def _parse_finding(n: int, table: dict[str, Any], report: Add,
                   names: frozenset[str]) -> Finding | None:
    where = ("findings", n)
    ok = True
    fields: dict[str, Any] = {}
    for key in FINDING_KEYS:
        if key not in table:
            report(where, f"is missing required key '{key}'")
            ok = False
    value = table.get("id")
    if "id" in table and (not isinstance(value, str) or not FINDING_ID.match(value)):
        report((*where, "id"), "expected a finding id: a lowercase letter, then lowercase letters, "
                               f"digits or '-' (at most 48), got {_show(value)}")
        ok = False
    fields["id"] = value
    for key in ("claim", "cite"):
        if key in table:
            text = _text((*where, key), table[key], report, empty=False)
            ok = ok and text is not None
            fields[key] = text
    check = table.get("check")
    if "check" in table and (not isinstance(check, str) or check not in CHECKS):
        report((*where, "check"), f"unknown check {_show(check)}; expected one of {', '.join(CHECKS)}")
        return None
    if check is None:
        return None
    spec = CHECKS[check]
    options: dict[str, Any] = {}
    for key, value in table.items():
        if key in FINDING_KEYS:
            continue
        if key not in spec:
            report((*where, key), f"unknown key for check \"{check}\"; expected "
                                  f"{', '.join((*FINDING_KEYS, *spec))}")
            ok = False
            continue
        checked = _check_option(check, key, value, (*where, key), report, names)
        if checked is _BAD:
            ok = False
        else:
            options[key] = checked
    for key, default in spec.items():
        if key in table:  # given: checked above
            continue
        if default is _REQUIRED:
            report(where, f"is missing key '{key}', which check \"{check}\" needs")
            ok = False
        elif key == "ref" and check == "bounded":
            x = options.get("x")
            param = _SPEC_PARAMS.get(x) if isinstance(x, str) else None
            default = param.default if param is not None else None
            options[key] = default if _scalar(default) and default != "" else None
        else:
            options[key] = list(default) if isinstance(default, tuple) else default
    if ok:
        ok = _check_combination(check, options, where, report)
    if not ok:
        return None
    return Finding(id=fields["id"], claim=fields["claim"], cite=fields["cite"], check=check,
                   options=MappingProxyType(options))


_BAD = object()


def _check_option(check: str, key: str, value: Any, where: tuple[Any, ...], report: Add,
                  names: frozenset[str]) -> Any:
    """A check key's value as stored in the options, or ``_BAD`` (reported)."""
    if key == "x":
        if not isinstance(value, str) or value not in names:
            report(where, f"expected the name of a cell parameter, got {_show(value)}; "
                          f"known: {', '.join(sorted(names))}")
            return _BAD
        return value
    if key == "metric":
        if not is_metric(value):
            report(where, f"expected one of {', '.join(METRICS)} or share:<layer kind>, got {_show(value)}")
            return _BAD
        return value
    if key == "expect":
        allowed = EXPECT_TREND if check == "trend" else EXPECT_OPTION
        if value not in allowed:
            report(where, f"expected one of {', '.join(allowed)}, got {_show(value)}")
            return _BAD
        return value
    if key == "kind":
        if not isinstance(value, str) or not LAYER_KIND.match(value):
            report(where, "expected a layer kind (conv, dense, relu, maxpool, …: lowercase letters, "
                          f"digits and '_'), got {_show(value)}")
            return _BAD
        return value
    if key in ("value", "ref"):
        if not _scalar(value):
            report(where, f"expected a value of the parameter (text, number or true / false), got {_show(value)}")
            return _BAD
        if isinstance(value, str) and _text(where, value, report, empty=False) is None:
            return _BAD
        return value
    if key == "where":
        if (not isinstance(value, dict) or not value or len(value) > MAX_ALONG
                or not all(isinstance(k, str) and k in names and _scalar(v) for k, v in value.items())):
            report(where, f"expected a table of at most {MAX_ALONG} cell parameters = a value each (the "
                          f"cells the check looks at), got {_show(value)}")
            return _BAD
        for name, v in value.items():
            if isinstance(v, str) and _text((*where, name), v, report, empty=False) is None:
                return _BAD
        return dict(value)
    if key == "along":
        if (not isinstance(value, list) or len(value) > MAX_ALONG
                or not all(isinstance(v, str) and v in names for v in value)):
            report(where, f"expected a list of at most {MAX_ALONG} cell parameters that vary "
                          f"together with x, got {_show(value)}")
            return _BAD
        if len(set(value)) != len(value):
            report(where, "lists the same parameter twice")
            return _BAD
        return list(value)
    # the numbers: tolerance, at_least, at_most, about
    low, what = {"tolerance": (0.0, "a tolerance >= 0"), "at_least": (1.0, "a ratio >= 1"),
                 "at_most": (0.0, "a bound > 0"), "about": (0.0, "a relative change > 0")}[key]
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < low or (value == low and key in ("at_most", "about")) or value > 1e6):
        report(where, f"expected {what} (a finite number, at most 1e6), got {_show(value)}")
        return _BAD
    return float(value)


def _check_combination(check: str, options: dict[str, Any], where: tuple[Any, ...],
                       report: Add) -> bool:
    x = options.get("x")
    if x is not None and x in options.get("along", ()):
        report((*where, "along"), f"lists x ({x}) itself")
        return False
    if check == "option" and _same(options["value"], options["ref"]):
        report((*where, "value"), f"is the same as ref ({_show(options['ref'])}): the check compares two values")
        return False
    return True


def _parse_paper(raw: Any, report: Add, names: frozenset[str]) -> PaperTable | None:
    if not isinstance(raw, dict):
        report(("paper",), f"expected a table, got {_show(raw)}")
        return None
    ok = True
    out: dict[str, Any] = {"source": "", "note": "", "x": None, "metric": None}
    for key, value in raw.items():
        where = ("paper", key)
        if key in ("source", "note"):
            text = _text(where, value, report, empty=True)
            ok = ok and text is not None
            out[key] = text
        elif key == "x":
            if not isinstance(value, str) or value not in names:
                report(where, f"expected the name of a cell parameter, got {_show(value)}")
                ok = False
            out[key] = value
        elif key == "metric":
            if not is_metric(value):
                report(where, f"expected one of {', '.join(METRICS)} or share:<layer kind>, got {_show(value)}")
                ok = False
            out[key] = value
        elif key not in ("columns", "rows"):
            report(where, f"unknown key; expected one of {', '.join(PAPER_KEYS)}")
            ok = False
    columns = _paper_columns(raw.get("columns"), report)
    rows = _paper_rows(raw.get("rows"), columns, report)
    if columns is None or rows is None:
        return None
    for key in ("x", "metric"):
        if ok and out[key] is not None and out[key] not in columns:
            report(("paper", key), f"{_show(out[key])} is not one of the columns; name the column "
                                   "that holds it")
            ok = False
    if not ok:
        return None
    return PaperTable(source=out["source"], note=out["note"], x=out["x"], metric=out["metric"],
                      columns=columns, rows=rows)


def _paper_columns(raw: Any, report: Add) -> tuple[str, ...] | None:
    where = ("paper", "columns")
    if raw is None:
        report(("paper",), "is missing required key 'columns'")
        return None
    if not isinstance(raw, list) or not raw or len(raw) > MAX_PAPER_COLUMNS:
        report(where, f"expected a list of 1 to {MAX_PAPER_COLUMNS} column names, got {_show(raw)}")
        return None
    ok = True
    for i, name in enumerate(raw):
        if not isinstance(name, str):
            report((*where, i), f"expected a column name, got {_show(name)}")
            ok = False
        elif _text((*where, i), name, report, empty=False, limit=200) is None:
            ok = False
    if ok and len(set(raw)) != len(raw):
        report(where, "names the same column twice")
        ok = False
    return tuple(raw) if ok else None


def _paper_rows(raw: Any, columns: tuple[str, ...] | None, report: Add) -> tuple[tuple[Any, ...], ...] | None:
    where = ("paper", "rows")
    if raw is None:
        report(("paper",), "is missing required key 'rows'")
        return None
    if not isinstance(raw, list) or len(raw) > MAX_PAPER_ROWS:
        report(where, f"expected a list of at most {MAX_PAPER_ROWS:,} rows, got "
                      f"{f'{len(raw):,} rows' if isinstance(raw, list) else _show(raw)}")
        return None
    rows = []
    ok = True
    for i, row in enumerate(raw):
        if not isinstance(row, list) or len(row) > MAX_PAPER_COLUMNS:
            report((*where, i), f"expected a list of at most {MAX_PAPER_COLUMNS} values, got {_show(row)}")
            ok = False
            continue
        if columns is not None and len(row) != len(columns):
            report((*where, i), f"has {len(row)} values for {len(columns)} columns")
            ok = False
            continue
        for j, value in enumerate(row):
            if not _scalar(value):
                report((*where, i, j), f"expected text, a finite number or true / false, got {_show(value)}")
                ok = False
            elif isinstance(value, str) and _text((*where, i, j), value, report, empty=True) is None:
                ok = False
        rows.append(tuple(row))
    return tuple(rows) if ok and columns is not None else None


def _scalar(value: Any) -> bool:
    """Text, a finite number that JSON holds exactly, or a boolean (no dates, lists, tables)."""
    if isinstance(value, bool) or isinstance(value, str):
        return True
    if isinstance(value, int):
        return abs(value) <= _MAX_INT
    return isinstance(value, float) and math.isfinite(value)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (
        not isinstance(a, (bool, str)) and not isinstance(b, (bool, str)) and a == b)


def _text(where: tuple[Any, ...], value: Any, report: Add, *, empty: bool,
          limit: int = MAX_TEXT) -> str | None:
    """A one-line text of at most ``limit`` characters without control characters."""
    if not isinstance(value, str):
        report(where, f"expected text, got {_show(value)}")
        return None
    if len(value) > limit:
        report(where, f"is {len(value):,} characters long; at most {limit:,}")
        return None
    if _CONTROL.search(value):
        report(where, f"expected text without control characters (line breaks, tabs, …), got {_show(value)}")
        return None
    if not empty and not value.strip():
        report(where, "is empty")
        return None
    return value


def _show(value: Any) -> str:
    """A value as the user wrote it, for messages (cut before formatting: values may be huge)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        text = f'"{value[:60]}"'
    elif isinstance(value, (list, dict)):
        text = f"a {'list' if isinstance(value, list) else 'table'} of {len(value):,} item{'s' * (len(value) != 1)}"
        return text
    else:
        text = repr(value)
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)  # one line, nothing for a terminal
    return text if len(text) <= 60 else text[:57] + "..."


# -- registering ---------------------------------------------------------------------------


def register_study(con: duckdb.DuckDBPyConnection, decl: StudyDecl, *, profile: str | None,
                   matrix: str, cell_ids: Sequence[str]) -> None:
    """Write ``decl`` into the warehouse open on ``con`` (a writer), in one transaction: the
    study and its findings replace its previous declaration, and ``cell_ids`` replace the
    cells of (study, ``profile``) — None is the base matrix (``BASE_PROFILE``).  ``matrix``:
    the study file's path, as text.  Raises ``InputError`` for a bad argument and
    ``WarehouseError`` (nothing written) when the warehouse refuses."""
    profile = BASE_PROFILE if profile is None else profile
    if not isinstance(profile, str) or not profile or len(profile) > 64 or _CONTROL.search(profile):
        raise InputError(f"register_study: bad profile name {_show(profile)}")
    if not isinstance(matrix, str) or len(matrix) > 4096:
        raise InputError(f"register_study: bad matrix path {_show(matrix)}")
    if not all(isinstance(c, str) and 0 < len(c) <= 128 for c in cell_ids):
        raise InputError("register_study: every cell id must be a non-empty text of at most 128 characters")
    ids = [finding.id for finding in decl.findings]
    if len(set(ids)) != len(ids):  # the lake has no key to refuse them: refused here
        raise InputError(f"register_study: study {decl.id} declares a finding id twice")
    cells = sorted(set(cell_ids))
    declared = datetime.now(timezone.utc).replace(tzinfo=None)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM study_findings WHERE study = ?", [decl.id])
        con.execute("DELETE FROM studies WHERE study = ?", [decl.id])
        con.execute("INSERT INTO studies (study, title, seed, source, needs, gpus, \"view\", "
                    "matrix, paper, declared_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [decl.id, decl.title, decl.seed, decl.source, decl.needs, decl.gpus, decl.view,
                     matrix, decl.paper_json(), declared])
        for position, finding in enumerate(decl.findings):
            con.execute("INSERT INTO study_findings (study, finding, position, claim, cite, check_kind, "
                        "options) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [decl.id, finding.id, position, finding.claim, finding.cite, finding.check,
                         json.dumps(dict(finding.options), allow_nan=False, sort_keys=True)])
        con.execute("DELETE FROM study_cells WHERE study = ? AND profile = ?", [decl.id, profile])
        if cells:
            con.execute("INSERT INTO study_cells (study, profile, cell_id) "
                        "SELECT ?, ?, unnest(?::VARCHAR[])", [decl.id, profile, cells])
        materialise.refresh_studies(con, [decl.id])  # its findings, read from their cache
        con.execute("COMMIT")
    except duckdb.Error as exc:
        rollback(con)
        raise rolled_back(exc, f"registering study {decl.id}") from None
    except BaseException:
        rollback(con)
        raise
