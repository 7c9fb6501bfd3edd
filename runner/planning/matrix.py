"""matrix.toml → validated ``Matrix`` → frozen cells.  Pure: reading the file is the only I/O.

The format is documented in docs/MATRIX.md.  Every error names the file and a key path,
``matrix.toml: [axes -> batch_size -> 2] expected a positive integer, got "big"``, and all
errors found are reported together.

A hostile file ends in such an error too, never in a traceback or an exhausted machine: the
file's size, the nesting of its values and the lengths of its paths are bounded, and the
cells are counted (axes × zips + includes) before a single one is built; the product is then
walked lazily, each combination resolved as it comes.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping

from matrun.errors import InputError, MatrixError
from matrun.runner.harness.models import is_transformer
from matrun.frameworks import display_name, get_framework, parameter_server_frameworks, release_key
from matrun.runner.harness.spec import (
    SYSTEM_VARIANT, interpreter_problem, knob_problem, layer_profile_problem, transformer_problem, unused_keys,
)
from matrun.runner.planning.overrides import spelled
from matrun.runner.planning.params import PARAMS, ParamError, plain, show
from matrun.runner.planning.presets import apply_preset
from matrun.runner.planning.sequential import MAX_ADAPTIVE
from matrun.runner.slurm.settings import SlurmSettings, parse_slurm_section
from matrun.tomltext import TomlError, TomlTooDeep, loads as toml_loads
from matrun.warehouse.findings import StudyDecl, parse_study

SECTIONS = ("sweep", "fixed", "axes", "zip", "include", "exclude", "slurm", "profiles", "study", "findings", "paper")
#: What a ``[profiles.<name>]`` table may hold (docs/MATRIX.md "Profiles").
PROFILE_KEYS = ("about", "sweep", "fixed", "axes", "zip")
#: At most this many profiles in one matrix.
MAX_PROFILES = 32
EXECUTORS = ("auto", "local", "docker", "slurm")
DEFAULT_MAX_CELLS = 10_000
#: The most ``[sweep] max_cells`` may allow: beyond it planning alone takes minutes and
#: gigabytes (every cell is resolved, checked and hashed before anything runs).
MAX_CELLS_CEILING = 100_000
#: At most this many ``[[exclude]]`` tables (each is tested against every combination).
MAX_EXCLUDES = 1_000
#: A matrix file larger than this is refused before it is read.
MAX_MATRIX_BYTES = 16 * 2**20
#: Tables and arrays nested in a matrix (``[[exclude]]`` → table → list → synthetic_shape is 4).
MAX_NESTING = 8
#: Paths: each component at most NAME_MAX bytes, the whole path at most PATH_MAX (Linux).
MAX_PATH_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
#: At most this many errors are listed; the rest are counted.
MAX_ERRORS = 50
#: Keys that name a path (``[slurm] python`` is checked by its own rule as well).
PATH_KEYS = ("results", "warehouse", "data_dir")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_PROFILE = re.compile(r"^[a-z][a-z0-9_-]{0,31}\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


#: ``[sweep] canary``: at most this many runs between two canary runs, at most this many
#: ``where`` selectors of the reference cell, each at most this long.
MAX_CANARY_EVERY = 100_000
MAX_CANARY_WHERE = 32
MAX_CANARY_WHERE_CHARS = 1000
#: ``[sweep] busy_reruns``: at most this many re-runs of one repeat that started busy, and the
#: default (runner/sweep/busy.py; docs/MATRIX.md "Busy runs").
MAX_BUSY_RERUNS = 100
DEFAULT_BUSY_RERUNS = 2
#: The default of ``[sweep] rerun_busy`` for a file that does not set it, when set (true or
#: false); unset, a study file's default is true and a plain matrix's false.  For a host where
#: every run starts busy by design (a test suite on two workers): re-runs would only triple it.
RERUN_BUSY_VARIABLE = "MATRUN_RERUN_BUSY"
_BOOLEAN_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def rerun_busy_default(study: bool) -> bool:
    """The ``rerun_busy`` of a file that does not set it: ``$MATRUN_RERUN_BUSY`` when set,
    else whether the file is a study; ``InputError`` naming the variable for another value."""
    text = os.environ.get(RERUN_BUSY_VARIABLE)
    if text is None or not text.strip():
        return study
    value = _BOOLEAN_WORDS.get(text.strip().lower())
    if value is None:
        raise InputError(f"{RERUN_BUSY_VARIABLE}: expected true or false, got '{printable(text, 40)}'")
    return value


@dataclass(frozen=True)
class CanarySettings:
    """``[sweep] canary`` (docs/MATRIX.md "Drift canary"): a run of one reference cell at the
    start of the sweep, after every ``every`` of its runs and at its end, to track the
    machine's drift (runner/sweep/canary.py)."""

    every: int | None = None
    """Runs between two canary runs; None: about eight intervals over the runs to do."""
    where: tuple[str, ...] = ()
    """``KEY=VALUE[,VALUE…]`` selectors (as ``--where``) of the reference cell, the first cell
    of the matrix they match; (): the first cell the sweep runs."""


@dataclass(frozen=True)
class SweepSettings:
    name: str = "default"
    results: Path = Path("results")
    warehouse: Path = Path("matrun.duckdb")
    data_dir: Path | None = None
    repeats: int = 1  # the repeats every cell gets: the fixed count, or an adaptive design's min
    repeats_max: int | None = None  # [sweep] repeats = { min, max }: the adaptive design's max (None: fixed)
    max_time: float | None = None  # [sweep] repeats.max_time: no round of extra repeats starts after it (s)
    timeout: float = 1800.0
    executor: str = "auto"
    max_cells: int = DEFAULT_MAX_CELLS
    canary: CanarySettings | None = None  # [sweep] canary; None: no canary runs
    rerun_busy: bool = False  # [sweep] rerun_busy; a study file's default is true (parse_matrix)
    busy_reruns: int = DEFAULT_BUSY_RERUNS  # [sweep] busy_reruns: extra attempts per repeat


@dataclass(frozen=True)
class CellParams:
    """One resolved combination: every parameter with its canonical value."""

    values: Mapping[str, Any]
    varying: tuple[str, ...] = ()  # keys that differ between the matrix's cells

    @property
    def identity(self) -> dict[str, Any]:
        """The parameters that define what is measured: execution settings, unused (null)
        keys and keys at their default are left out, so a parameter added to matrun later
        does not change the id of any existing cell.  Changing a default is therefore a
        change of the harness protocol (runner/environments/home.py HARNESS_PROTOCOL)."""
        return {k: v for k, v in self.values.items()
                if PARAMS[k].identity and v is not None and v != PARAMS[k].default}

    @property
    def label(self) -> str:
        """``key=value`` for each parameter that varies between the matrix's cells and that
        this cell uses: a null value (a parameter that does not apply, such as ``kvstore``
        for torch) is left out; framework, model and dataset when nothing else is left."""
        parts = [f"{k}={plain(self.values[k]) if self.values[k] != '' else '(pins)'}"
                 for k in self.varying if self.values[k] is not None]
        return " ".join(parts or (f"{k}={plain(self.values[k])}" for k in ("framework", "model", "dataset")))


@dataclass(frozen=True)
class Matrix:
    path: Path
    sweep: SweepSettings
    cells: tuple[CellParams, ...] = field(default_factory=tuple)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)  # [slurm]: how the slurm executor submits
    profile: str | None = None
    """The ``[profiles.<name>]`` applied (None: the base matrix)."""
    profiles: Mapping[str, str] = field(default_factory=dict)
    """Every profile the file declares, name -> its ``about`` text."""
    study: StudyDecl | None = None
    """``[study]``, ``[[findings]]`` and ``[paper]`` of a study file (None for a plain matrix)."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """The ``--set`` values applied after the profile, parameter -> value as given."""


@dataclass(frozen=True)
class Space:
    """A matrix's axes and zip groups as a search space, unexpanded (``load_space``)."""

    path: Path
    profile: str | None
    overrides: Mapping[str, Any]
    """The ``--set`` values the space was read with."""
    sweep: SweepSettings
    fixed: Mapping[str, Any]
    axes: Mapping[str, tuple[Any, ...]]
    zips: tuple[Mapping[str, tuple[Any, ...]], ...]
    includes: int  # [[include]] rows (not part of the search: cells added beside the product)
    excludes: int
    study: bool

    @property
    def size(self) -> int:
        """Combinations of the axes and zip groups, before ``[[exclude]]``."""
        return math.prod(len(v) for v in self.axes.values()) * math.prod(_zip_len(dict(g)) for g in self.zips)


class _Errors:
    """The problems found, each ``<file>: [<key path>] <message>``, on one line each: control
    characters are shown escaped and long keys cut, so that what the user wrote cannot break
    or flood the terminal; past ``MAX_ERRORS`` they are only counted."""

    def __init__(self, path: Path) -> None:
        self.file = printable(path.name)
        self.items: list[str] = []
        self.more = 0

    def add(self, where: tuple[Any, ...], message: str) -> None:
        if len(self.items) >= MAX_ERRORS:
            self.more += 1
            return
        key = " -> ".join(printable(str(p), 60) for p in where)
        self.items.append(f"{self.file}: [{key}] {printable(message)}")

    def add_line(self, text: str) -> None:
        """A problem that is not the file's (a ``--set`` value), as its own line."""
        if len(self.items) >= MAX_ERRORS:
            self.more += 1
            return
        self.items.append(printable(text))

    def raise_if_any(self) -> None:
        if self.items:
            more = [f"{self.file}: … and {self.more:,} more problems"] if self.more else []
            raise MatrixError("\n".join(self.items + more))


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x00``), cut to ``limit``."""
    if limit is not None and len(text) > limit:
        text = text[:limit - 3] + "..."
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def load_matrix(path: Path, profile: str | None = None, overrides: Mapping[str, Any] | None = None) -> Matrix:
    """Read, validate and expand a matrix file, with ``[profiles.<profile>]`` applied when a
    profile is named, then the ``overrides`` (``--set``: parameter -> value, as
    ``overrides.parse_overrides`` reads them; see ``apply_overrides``).  Raises
    ``MatrixError`` on any problem."""
    return parse_matrix(read_matrix_doc(path), path=path.resolve(), profile=profile, overrides=overrides)


def load_space(path: Path, profile: str | None = None, overrides: Mapping[str, Any] | None = None) -> Space:
    """The matrix file's search space (``matrun tune``): every section read and checked as
    ``load_matrix`` checks it, the profile and overrides applied, but no cell built — so a
    space of 10^6 combinations, over ``[sweep] max_cells``, is read in milliseconds.  Each
    combination becomes a cell through ``load_matrix`` with its values as overrides (the
    ``[[exclude]]`` rules and the frameworks' refusals tested then).  Raises ``MatrixError``."""
    doc = read_matrix_doc(path)
    parts = _sections(doc, path=path.resolve(), profile=profile, overrides=overrides)
    return Space(path=path.resolve(), profile=profile, overrides=MappingProxyType(dict(overrides or {})),
                 sweep=parts.sweep, fixed=MappingProxyType(parts.fixed),
                 axes=MappingProxyType({k: tuple(v) for k, v in parts.axes.items()}),
                 zips=tuple(MappingProxyType({k: tuple(v) for k, v in g.items()}) for g in parts.zips),
                 includes=len(parts.includes), excludes=len(parts.excludes), study=parts.study is not None)


def read_matrix_doc(path: Path) -> dict[str, Any]:
    """The matrix file's TOML document, its size and nesting bounded.  Raises ``MatrixError``."""
    shown = printable(str(path), 200)
    try:
        size = path.stat().st_size
        if size > MAX_MATRIX_BYTES:
            raise MatrixError(f"{printable(path.name, 200)}: is {size / 2**20:.1f} MiB, over the "
                              f"{MAX_MATRIX_BYTES // 2**20} MiB limit of a matrix file")
        with open(path, "rb") as fh:
            text = fh.read(MAX_MATRIX_BYTES + 1).decode("utf-8")
    except FileNotFoundError:
        raise MatrixError(f"{shown}: no such matrix file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixError(f"{shown}: cannot read: {printable(str(exc), 200)}") from None
    name = printable(path.name, 200)
    try:
        return toml_loads(text)  # an unclosed value at the end is named by where it opened
    except TomlTooDeep:
        raise MatrixError(f"{name}: invalid TOML: arrays or inline tables nested more than "
                          f"{MAX_NESTING} deep") from None
    except TomlError as exc:
        raise MatrixError(f"{name}: invalid TOML: {printable(str(exc))}") from None


@dataclass
class _Sections:
    errors: _Errors
    sweep: SweepSettings
    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    zips: list[dict[str, list[Any]]]
    includes: list[dict[str, Any]]
    excludes: list[dict[str, Any]]
    slurm: SlurmSettings
    study: StudyDecl | None
    profiles: dict[str, str]
    overrides: dict[str, Any]


def _sections(doc: Mapping[str, Any], *, path: Path, profile: str | None,
              overrides: Mapping[str, Any] | None) -> _Sections:
    """Every section of the document checked, the profile and the overrides applied; no cell
    built.  Raises ``MatrixError`` with every problem found."""
    overrides = dict(overrides or {})
    errors = _Errors(path)
    _check_nesting(doc, errors)
    errors.raise_if_any()
    for key in doc:
        if key not in SECTIONS:
            errors.add((key,), f"unknown section; expected one of {', '.join(SECTIONS)}")
    study = parse_study(doc, errors.add, param_names=tuple(PARAMS))
    profiles = _parse_profiles(doc.get("profiles", {}), errors, base=path.parent)
    _check_overrides(overrides, errors)
    errors.raise_if_any()
    if profile is not None:
        if profile not in profiles:
            declared = ", ".join(profiles) or "none"
            raise MatrixError(f"{errors.file}: [profiles -> {printable(profile, 60)}] no such profile; "
                              f"this file declares: {declared}")
        doc = apply_profile(doc, doc["profiles"][profile], profile)
    if overrides:
        doc = apply_overrides(doc, overrides)
        # what fails from here on may be the overrides' doing: the messages say they applied
        errors.file = printable(f"{errors.file} with {spelled(overrides)}", 300)
    sweep = _parse_sweep(doc.get("sweep", {}), errors, base=path.parent)
    if not (isinstance(doc.get("sweep"), dict) and "rerun_busy" in doc["sweep"]):
        # a study's verdicts want clean runs: on unless it (or $MATRUN_RERUN_BUSY) says
        sweep = replace(sweep, rerun_busy=rerun_busy_default(study is not None))
    fixed = _parse_fixed(doc.get("fixed", {}), errors)
    axes = _parse_axes(doc.get("axes", {}), errors)
    zips = _parse_zips(doc.get("zip", []), errors)
    includes = _parse_rows(doc.get("include", []), "include", errors, lists=False)
    excludes = _parse_rows(doc.get("exclude", []), "exclude", errors, lists=True)
    slurm = parse_slurm_section(doc.get("slurm", {}), errors.add)
    if slurm.python is not None:
        problem = path_problem(slurm.python)
        if problem:
            errors.add(("slurm", "python"), problem)
    _check_overlaps(fixed, axes, zips, errors)
    errors.raise_if_any()
    return _Sections(errors, sweep, fixed, axes, zips, includes, excludes, slurm, study, profiles, overrides)


def parse_matrix(doc: Mapping[str, Any], *, path: Path, profile: str | None = None,
                 overrides: Mapping[str, Any] | None = None) -> Matrix:
    parts = _sections(doc, path=path, profile=profile, overrides=overrides)
    errors, sweep, fixed, axes, zips = parts.errors, parts.sweep, parts.fixed, parts.axes, parts.zips
    includes, excludes, overrides = parts.includes, parts.excludes, parts.overrides

    # Counted before anything is built: the product of the axes' and zips' lengths, plus
    # the includes (exclusions are known only combination by combination).
    size = math.prod(len(vals) for vals in axes.values()) * math.prod(_zip_len(g) for g in zips)
    size += len(includes)
    if size > sweep.max_cells:
        raise MatrixError(
            f"{errors.file}: [axes] the matrix expands to {size:,} cells, over the limit of "
            f"{sweep.max_cells:,}; narrow the axes or raise [sweep] max_cells (at most "
            f"{MAX_CELLS_CEILING:,}; cells are counted before [[exclude]])")

    resolved: list[dict[str, Any]] = []
    seen: set[bytes] = set()
    for where, combo in _combinations(axes, zips, includes, excludes, fixed):
        values = {name: p.default for name, p in PARAMS.items()}
        values["timeout"] = sweep.timeout
        values.update(fixed)
        values.update(combo)
        try:
            explicit = set(fixed) | set(combo)
            values = canonical(apply_preset(framework_defaults(values, explicit=explicit), explicit=explicit))
        except ParamError as exc:
            if combo:
                errors.add(where, f"{_describe(combo)}: {exc}")
            else:
                errors.add(("fixed",), str(exc))
            continue
        # 16 bytes per cell, not its whole text: a large matrix stays small in memory
        key = hashlib.blake2b(repr(sorted(values.items())).encode(), digest_size=16).digest()
        if key not in seen:  # an include may repeat a product cell: keep one
            seen.add(key)
            resolved.append(values)
    errors.raise_if_any()
    if not resolved:
        raise MatrixError(f"{errors.file}: [exclude] every combination is excluded: the matrix expands to no cells")

    varying = tuple(k for k in PARAMS if _varies(resolved, k))
    cells = tuple(CellParams(MappingProxyType(r), varying) for r in resolved)
    return Matrix(path=path, sweep=sweep, cells=cells, slurm=parts.slurm, profile=profile, profiles=parts.profiles,
                  study=parts.study, overrides=MappingProxyType(overrides))


def _parse_profiles(raw: Any, errors: _Errors, *, base: Path) -> dict[str, str]:
    """Check every ``[profiles.<name>]`` (applied or not, so that ``matrun plan`` finds a
    mistake in any of them): name -> its ``about`` text.  Each section is checked as the base
    matrix's own is, with its errors under ``[profiles -> <name> -> ...]``."""
    if not isinstance(raw, dict):
        errors.add(("profiles",), f"expected tables [profiles.<name>], got {show(raw)}")
        return {}
    if len(raw) > MAX_PROFILES:
        errors.add(("profiles",), f"declares {len(raw):,} profiles; at most {MAX_PROFILES}")
        return {}
    found: dict[str, str] = {}
    for name, table in raw.items():
        where = ("profiles", name)
        if not _PROFILE.match(name):
            errors.add(where, "expected a profile name of lower-case letters, digits, '_' or '-' "
                              "(at most 32, starting with a letter)")
            continue
        if not isinstance(table, dict):
            errors.add(where, f"expected a table of sweep / fixed / axes / zip overrides, got {show(table)}")
            continue
        inner = _Prefixed(errors, where)
        for key, value in table.items():
            if key not in PROFILE_KEYS:
                inner.add((key,), f"unknown key; a profile may set {', '.join(PROFILE_KEYS)}")
        about = table.get("about", "")
        if not isinstance(about, str) or len(about) > 500 or _CONTROL.search(about):
            inner.add(("about",), f"expected a line of text (at most 500 characters), got {show(about)}")
            about = ""
        if "sweep" in table:
            _parse_sweep(table["sweep"], inner, base=base)  # type: ignore[arg-type]
        if "fixed" in table:
            _parse_fixed(table["fixed"], inner)  # type: ignore[arg-type]
        if "axes" in table:
            _parse_axes(table["axes"], inner)  # type: ignore[arg-type]
        zips = _parse_zips(table.get("zip", []), inner)  # type: ignore[arg-type]
        fixed = table.get("fixed") if isinstance(table.get("fixed"), dict) else {}
        axes = table.get("axes") if isinstance(table.get("axes"), dict) else {}
        _check_overlaps(dict(fixed), dict(axes), zips, inner)  # type: ignore[arg-type]
        found[name] = about
    return found


class _Prefixed:
    """An error list whose key paths start with ``prefix`` (a profile's sections)."""

    def __init__(self, errors: _Errors, prefix: tuple[Any, ...]) -> None:
        self.errors = errors
        self.prefix = prefix
        self.file = errors.file

    def add(self, where: tuple[Any, ...], message: str) -> None:
        self.errors.add(self.prefix + tuple(where), message)


def apply_profile(doc: Mapping[str, Any], profile: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The matrix document with a (checked) profile applied: its ``sweep`` keys replace the
    base's; every parameter it sets in ``fixed``, ``axes`` or ``zip`` is first taken out of
    wherever the base set it (so a profile may fix what the base varies and vary what it
    fixes), then set where the profile says; its ``zip`` tables are added after the base's
    remaining ones.  A base zip table that loses keys keeps the rest, its repeated rows
    dropped.  The sweep's name becomes ``<name>-<profile>`` unless the profile names it, so
    each profile has its own results folder."""
    out = dict(doc)
    if isinstance(doc.get("sweep", {}), dict):  # (a malformed base is reported as such later)
        sweep = dict(doc.get("sweep", {}))
        base_name = sweep.get("name", SweepSettings.name)
        sweep["name"] = f"{base_name}-{name}" if isinstance(base_name, str) else base_name
        sweep.update(_table(profile.get("sweep")))
        out["sweep"] = sweep
    p_fixed, p_axes = _table(profile.get("fixed")), _table(profile.get("axes"))
    p_zips = [dict(g) for g in profile.get("zip", []) if isinstance(g, dict)]
    out = _without(out, set(p_fixed) | set(p_axes) | {k for g in p_zips for k in g})
    if isinstance(doc.get("fixed", {}), dict):
        out["fixed"] = {**out.get("fixed", {}), **p_fixed}
    if isinstance(doc.get("axes", {}), dict):
        out["axes"] = {**out.get("axes", {}), **p_axes}
    if isinstance(doc.get("zip", []), list):
        out["zip"] = [*out.get("zip", []), *p_zips]
    return out


def apply_overrides(doc: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The matrix document (its profile applied) with ``--set`` values: each becomes a
    ``[fixed]`` value, taken out of ``[axes]`` and ``[[zip]]`` as a profile's are (a zip table
    that loses keys keeps the rest, its repeated rows dropped), and replaces the value of every
    ``[[include]]`` row that names it.  ``[[exclude]]`` rules stay as written: a rule naming an
    overridden key is tested against its new value, as it would be had the file fixed it (a
    rule that excluded another value no longer excludes anything).  The result is the document
    of the same file edited so: each value written in ``[fixed]`` in place of wherever the file
    set the key; each cell, and its id, is the one that edit gives.  The sweep's name is kept
    (its results folder too: the cells' ids tell them apart)."""
    out = _without(doc, set(overrides))
    if isinstance(doc.get("fixed", {}), dict):
        out["fixed"] = {**out.get("fixed", {}), **overrides}
    if isinstance(doc.get("include", []), list):
        out["include"] = [{k: overrides.get(k, v) for k, v in row.items()} if isinstance(row, dict) else row
                          for row in doc.get("include", [])]
    return out


def _table(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _without(doc: Mapping[str, Any], moved: set[str]) -> dict[str, Any]:
    """The document with the parameters ``moved`` taken out of ``[fixed]``, ``[axes]`` and
    every ``[[zip]]`` table (one that loses keys keeps the rest, its rows made unique; one
    left empty is dropped).  Malformed sections are kept as they are, to be reported."""
    out = dict(doc)
    if isinstance(doc.get("fixed", {}), dict):
        out["fixed"] = {k: v for k, v in doc.get("fixed", {}).items() if k not in moved}
    if isinstance(doc.get("axes", {}), dict):
        out["axes"] = {k: v for k, v in doc.get("axes", {}).items() if k not in moved}
    if isinstance(doc.get("zip", []), list):
        zips: list[Any] = []
        for group in doc.get("zip", []):
            if not isinstance(group, dict) or not all(isinstance(v, list) for v in group.values()):
                zips.append(group)
                continue
            kept = {k: v for k, v in group.items() if k not in moved}
            if kept and len(kept) < len(group):  # rows that became equal are one row
                rows: dict[str, int] = {}
                for i in range(min(len(v) for v in kept.values())):
                    rows.setdefault(repr([v[i] for v in kept.values()]), i)
                kept = {k: [v[i] for i in rows.values()] for k, v in kept.items()}
            if kept:
                zips.append(kept)
        out["zip"] = zips
    return out


def _check_overrides(overrides: Mapping[str, Any], errors: _Errors) -> None:
    """Each ``--set`` value checked as the file's own value of the key is, each problem a line
    ``--set <key>: <words>``."""
    for key, value in overrides.items():
        label = f"--set {printable(str(key), 60)}"
        param = PARAMS.get(key) if isinstance(key, str) else None
        if param is None:
            errors.add_line(f"{label}: unknown parameter; known: {', '.join(PARAMS)}")
            continue
        deep = _Errors(Path("--set"))
        _check_nesting({"fixed": {key: value}}, deep)  # as deep as the file's [fixed] may nest
        if deep.items:
            errors.add_line(f"{label}: nests tables and arrays more than {MAX_NESTING} deep")
            continue
        try:
            param.check(value)
        except ParamError as exc:
            errors.add_line(f"{label}: {exc}")


def _combinations(axes: dict[str, list[Any]], zips: list[dict[str, list[Any]]],
                  includes: list[dict[str, Any]], excludes: list[dict[str, Any]],
                  fixed: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(where, values) of each combination, lazily: the product in order, less what an
    ``[[exclude]]`` matches, then the includes."""
    dims: list[list[dict[str, Any]]] = [[{k: v} for v in vals] for k, vals in axes.items()]
    dims += [[{k: vals[i] for k, vals in group.items()} for i in range(_zip_len(group))] for group in zips]
    for picks in itertools.product(*dims):
        combo: dict[str, Any] = {}
        for pick in picks:
            combo.update(pick)
        if not any(_matches(combo, rule, fixed) for rule in excludes):
            yield ("axes",), combo
    for n, row in enumerate(includes):
        yield ("include", n), row


def _varies(rows: list[dict[str, Any]], key: str) -> bool:
    """Whether ``key`` takes more than one value (as labels spell it) over ``rows``."""
    first = rows[0][key]
    return any(r[key] != first for r in rows) and len({plain(r[key]) for r in rows}) > 1


#: The parameters whose value, when a matrix does not set it, is the framework's own default on
#: a GPU (``[defaults]`` of images/<name>/framework.toml): what the framework's users run when
#: they say nothing.  On the CPU they keep matrun's defaults (``PARAMS``): conv_algo is a GPU
#: choice, and CPU cells keep the ids they have had (docs/MATRIX.md "Framework defaults").
GPU_FRAMEWORK_DEFAULTS = ("conv_algo", "layout")


def framework_defaults(values: dict[str, Any], *, explicit: set[str]) -> dict[str, Any]:
    """``values`` with each of ``GPU_FRAMEWORK_DEFAULTS`` the matrix did not set (``explicit``:
    the keys it set) at the framework's own default, for a GPU cell of a framework matrun
    knows; else ``values`` unchanged.  Applied before a preset (whose values win) and
    ``canonical``: the resolved value is the cell's value, in its id and in the warehouse."""
    if values.get("device") != "gpu":
        return values
    try:
        fw = get_framework(values["framework"])
    except InputError:  # an unknown framework: canonical names the problem
        return values
    out = dict(values)
    for key in GPU_FRAMEWORK_DEFAULTS:
        if key == "layout" and is_transformer(str(values.get("model"))):
            continue  # an image layout: a transformer has none (spec.transformer_problem)
        if key not in explicit and key in fw.defaults:
            out[key] = fw.defaults[key]
    return out


def canonical(values: dict[str, Any]) -> dict[str, Any]:
    """Null what a cell does not use (``unused_keys``, so identity ignores meaningless
    differences) and refuse what cannot run as asked."""
    out = dict(values)
    unused = unused_keys(out, parameter_servers=out["framework"] in parameter_server_frameworks(),
                         onednn=get_framework(out["framework"]).onednn)
    if out["device"] == "cpu" and out["conv_algo"] == "autotune":
        raise ParamError("conv_algo = \"autotune\" needs device = \"gpu\" (it selects cuDNN convolution algorithms)")
    shaped = transformer_problem(out)  # reads layout as written: before the nulls
    if shaped:
        raise ParamError(f"{shaped[0]} {shaped[1]}")
    _canonical_workers(out, unused)  # reads kvstore as written: before the nulls
    out.update(dict.fromkeys(unused))
    problem = layer_profile_problem(out)
    if problem:
        raise ParamError(f"layer_profile {problem}")
    knob = knob_problem(out)
    if knob:
        raise ParamError(f"{knob[0]} {knob[1]}")
    fw = get_framework(out["framework"])
    system = interpreter_problem(out)  # variant = "system" (the site's own Python) needs python
    if system:
        raise ParamError(f"{system[0]} {system[1]}")
    if out["variant"] not in fw.variants and out["variant"] != SYSTEM_VARIANT:
        raise ParamError(f"{out['framework']} has no variant \"{out['variant']}\"; known: "
                         f"{', '.join(fw.variants)} (images/{out['framework']}/framework.toml)")
    if out["device"] == "gpu" and out["variant"] in fw.variants and fw.variants[out["variant"]].device != "gpu":
        raise ParamError(f"variant \"{out['variant']}\" of {out['framework']} is a CPU build; a gpu cell needs "
                         f"one of: {', '.join(v for v, d in fw.variants.items() if d.device == 'gpu') or 'none'}")
    _canonical_release(out, fw)
    if is_transformer(out["model"]) and not fw.transformers:
        why = fw.transformers_reason or "its adapter does not build them yet (docs/TRANSFORMERS.md \"Transformers\")"
        raise ParamError(f"model {out['model']} is a transformer; {display_name(out['framework'])} has none: {why}")
    if is_transformer(out["model"]) and out["layer_profile"] and not fw.transformer_layer_profile:
        raise ParamError(f"layer_profile of a transformer is timed in the frameworks whose framework.toml says "
                         f"transformer_layer_profile = true; {display_name(out['framework'])}'s does not (yet)")
    reason = fw.refusal(out)
    if reason:
        raise ParamError(f"{out['framework']} cannot run this cell: {reason}")
    if out["warmup_steps"] >= _steps_upper_bound(out):
        raise ParamError(f"warmup_steps = {out['warmup_steps']} leaves no timed steps")
    return out


def _canonical_release(out: dict[str, Any], fw: Any) -> None:
    """``version``: a release of a framework that has ``[releases]``, for one of the variants it
    builds them for, no older than its adapter drives.  Whether the package index has it is
    asked when the cell is planned (runner/environments/releases.py), not here."""
    version = out["version"]
    if not version:
        return
    name = display_name(out["framework"])
    if out["variant"] == SYSTEM_VARIANT:
        raise ParamError(f'version "{version}" names a release for matrun to install; variant = "system" '
                         f"runs the site's own Python with whatever release it has: leave version out")
    rel = fw.releases
    if rel is None:
        why = fw.releases_reason or "its framework.toml has no [releases] (docs/RELEASES.md)"
        raise ParamError(f'version "{version}": {name} has no releases matrun can install here: {why}')
    if out["variant"] not in rel.variants:
        raise ParamError(f'version "{version}": {name}\'s releases are built for variant '
                         f'{" or ".join(rel.variants)}, not "{out["variant"]}" (its pins are its one release)')
    if rel.since and release_key(version) < release_key(rel.since):
        raise ParamError(f'version "{version}": matrun\'s {name} adapter drives {rel.package} {rel.since} and '
                         f"newer{': ' + rel.since_reason if rel.since_reason else ''}")


def _canonical_workers(out: dict[str, Any], unused: set[str]) -> None:
    """``workers``, ``nodes``, ``scaling``, ``kvstore``: refuse what cannot run; set ``gpus``
    of a multi-GPU cell.  ``unused``: the cell's unused keys (``kvstore`` is refused there).

    ``scaling`` is kept as written even for one worker (where it changes nothing), so that the
    1-worker cell of a scaling study pairs with its N-worker cells in the views."""
    world = out["workers"] * out["nodes"]
    if "kvstore" in unused:
        if out["kvstore"] != "device":
            owners = " and ".join(display_name(fw) for fw in parameter_server_frameworks()) or "no framework"
            raise ParamError(f"kvstore is the parameter-server choice of {owners}; {out['framework']} "
                             "exchanges gradients synchronously (all-reduce): leave kvstore out")
    elif world > 1 and out["kvstore"] == "device":
        raise ParamError(f"{display_name(out['framework'])} with {world} workers needs kvstore = \"dist_sync\" or "
                         "\"dist_async\" (a parameter server); \"device\" is one process")
    multi = world > 1 or out["kvstore"] in ("dist_sync", "dist_async")
    if multi and out["mode"] != "train":
        raise ParamError("a multi-worker cell trains: mode = \"inference\" runs in one process")
    if multi and out["layer_profile"]:
        raise ParamError("layer_profile times the layers of one process: use workers = 1")
    if out["scaling"] == "strong" and out["batch_size"] % world:
        raise ParamError(f"scaling = \"strong\" splits batch_size = {out['batch_size']} across {world} "
                         "workers: it must be a multiple of workers × nodes")
    if out["device"] == "gpu" and out["workers"] > 1:
        if out["gpus"] == 1:
            out["gpus"] = out["workers"]  # one GPU per worker
        elif out["gpus"] != out["workers"]:
            raise ParamError(f"a gpu cell with workers = {out['workers']} runs one worker per GPU: "
                             f"gpus must be {out['workers']} (or left out), not {out['gpus']}")


def _steps_upper_bound(v: Mapping[str, Any]) -> float:
    if v["iterations"] > 0:
        return v["iterations"]
    return math.inf  # dataset size is not known while planning; the harness records it


def _parse_sweep(raw: Any, errors: _Errors, *, base: Path) -> SweepSettings:
    if not isinstance(raw, dict):
        errors.add(("sweep",), f"expected a table, got {show(raw)}")
        return SweepSettings()
    kw: dict[str, Any] = {}
    for key, value in raw.items():
        where = ("sweep", key)
        if key == "name":
            if not isinstance(value, str) or not _NAME.match(value):
                errors.add(where, "expected a name of letters, digits, '.', '_' or '-' (at most 64, "
                                  f"not starting with '.' or '-'), got {show(value)}")
            else:
                kw["name"] = value
        elif key in PATH_KEYS:
            resolved, problem = _path(value, base)
            if problem:
                errors.add(where, problem)
            else:
                kw[key] = resolved
        elif key == "repeats":
            if isinstance(value, dict):
                kw.update(_parse_adaptive(value, errors))
            elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
                errors.add(where, f"expected a repeat count from 1 to 1000, or a table {{ min, max, max_time }} "
                                  f"(adaptive repeats), got {show(value)}")
            else:
                kw["repeats"] = value
        elif key == "timeout":
            try:
                kw["timeout"] = PARAMS["timeout"].check(value)
            except ParamError as exc:
                errors.add(where, str(exc))
        elif key == "executor":
            if value not in EXECUTORS:
                errors.add(where, f"expected one of {', '.join(EXECUTORS)}, got {show(value)}")
            else:
                kw["executor"] = value
        elif key == "max_cells":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CELLS_CEILING:
                errors.add(where, f"expected a positive integer at most {MAX_CELLS_CEILING:,}, got {show(value)}")
            else:
                kw["max_cells"] = value
        elif key == "canary":
            kw["canary"] = _parse_canary(value, errors)
        elif key == "rerun_busy":
            if not isinstance(value, bool):
                errors.add(where, f"expected true or false, got {show(value)}")
            else:
                kw["rerun_busy"] = value
        elif key == "busy_reruns":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BUSY_RERUNS:
                errors.add(where, f"expected a number of re-runs from 0 to {MAX_BUSY_RERUNS}, got {show(value)}")
            else:
                kw["busy_reruns"] = value
        else:
            errors.add(where, "unknown key; expected one of name, results, warehouse, data_dir, "
                              "repeats, timeout, executor, max_cells, canary, rerun_busy, busy_reruns")
    kw.setdefault("results", base / "results")
    kw.setdefault("warehouse", base / "matrun.duckdb")
    return SweepSettings(**kw)


def repeats_option(text: str | None, max_time: float | None = None) -> dict[str, Any]:
    """``--repeats N`` or ``--repeats MIN..MAX`` (adaptive) and ``--max-time``, as the
    SweepSettings fields they set ({} when neither is given).  Raises InputError naming the flag."""
    out: dict[str, Any] = {}
    if text is not None:
        m = re.fullmatch(r"\s*(\d{1,4})\s*(?:\.\.\s*(\d{1,4})\s*)?", text)
        if not m:
            raise InputError(f"--repeats: expected N or MIN..MAX (e.g. 4..12), got {show(text)}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if m.group(2) is None:
            if not 1 <= lo <= 1000:
                raise InputError(f"--repeats: expected a repeat count from 1 to 1000, got {lo}")
        elif not (1 <= lo <= MAX_ADAPTIVE and 1 <= hi <= MAX_ADAPTIVE):
            raise InputError(f"--repeats: adaptive repeats go from 1 to {MAX_ADAPTIVE}, got {lo}..{hi}")
        elif lo > hi:
            raise InputError(f"--repeats: min ({lo}) is more than max ({hi})")
        elif lo < hi < 4:
            raise InputError(f"--repeats: no verdict can be decided with at most {hi} repeats ({hi} against {hi} "
                             "runs cannot reach p < 0.05); give max at least 4")
        out.update(repeats=lo, repeats_max=hi if hi > lo else None)
    if max_time is not None:
        try:
            out["max_time"] = PARAMS["timeout"].check(max_time)
        except ParamError as exc:
            raise InputError(f"--max-time: expected a positive time budget: {exc}") from None
    return out


def _parse_adaptive(value: dict[str, Any], errors: _Errors) -> dict[str, Any]:
    """``[sweep] repeats = { min = 4, max = 12, max_time = "2h" }``: adaptive repeats
    (runner/planning/sequential.py).  Returns SweepSettings fields, {} with errors added."""
    where = ("sweep", "repeats")
    out: dict[str, Any] = {}
    for key in value:
        if key not in ("min", "max", "max_time"):
            errors.add((*where, key), "unknown key; expected min, max or max_time")
    for key in ("min", "max"):
        v = value.get(key)
        if key not in value:
            errors.add(where, f"adaptive repeats need {key} (e.g. {{ min = 4, max = 12 }})")
        elif isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_ADAPTIVE:
            errors.add((*where, key), f"expected a repeat count from 1 to {MAX_ADAPTIVE}, got {show(v)}")
        else:
            out[key] = v
    if "min" in out and "max" in out and out["min"] > out["max"]:
        errors.add(where, f"min ({out['min']}) is more than max ({out['max']})")
        return {}
    if "min" in out and "max" in out and out["max"] > out["min"] and out["max"] < 4:
        errors.add((*where, "max"), f"no verdict can be decided with at most {out['max']} repeats ({out['max']} "
                                    f"against {out['max']} runs cannot reach p < 0.05); give max at least 4")
        return {}
    budget = None
    if "max_time" in value:
        try:
            budget = PARAMS["timeout"].check(value["max_time"])
        except ParamError as exc:
            errors.add((*where, "max_time"), f"expected a positive time budget: {exc}")
            return {}
    if "min" not in out or "max" not in out:
        return {}
    return {"repeats": out["min"], "repeats_max": out["max"] if out["max"] > out["min"] else None,
            "max_time": budget}


def _parse_canary(value: Any, errors: _Errors) -> CanarySettings | None:
    """``[sweep] canary``: true / false, or a table of ``every`` and ``where`` (canary on)."""
    where = ("sweep", "canary")
    if isinstance(value, bool):
        return CanarySettings() if value else None
    if not isinstance(value, dict):
        errors.add(where, "expected true, false or a table of every and where "
                          f"(e.g. {{ every = 10, where = [\"threads=1\"] }}), got {show(value)}")
        return None
    kw: dict[str, Any] = {}
    for key, item in value.items():
        if key == "every":
            if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= MAX_CANARY_EVERY:
                errors.add((*where, key), f"expected a number of runs from 1 to {MAX_CANARY_EVERY:,}, "
                                          f"got {show(item)}")
            else:
                kw["every"] = item
        elif key == "where":
            selectors = _canary_where(item, errors)
            if selectors is not None:
                kw["where"] = selectors
        else:
            errors.add((*where, key), "unknown key; expected every or where")
    return CanarySettings(**kw)


def _canary_where(value: Any, errors: _Errors) -> tuple[str, ...] | None:
    """``[sweep] canary.where``: one ``KEY=VALUE[,VALUE…]`` or a list of them, as ``--where``
    takes them (KEY a parameter or ``cell``, an id prefix)."""
    where = ("sweep", "canary", "where")
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_CANARY_WHERE:
        errors.add(where, f"expected KEY=VALUE[,VALUE…] or a list of 1 to {MAX_CANARY_WHERE} of them, "
                          f"got {show(value)}")
        return None
    good = True
    for i, item in enumerate(items):
        at = where if isinstance(value, str) else (*where, i)
        key, sep, values = item.partition("=") if isinstance(item, str) else ("", "", "")
        if (not isinstance(item, str) or len(item) > MAX_CANARY_WHERE_CHARS or _CONTROL.search(item)
                or not sep or not key.strip() or not values.strip()):
            errors.add(at, f"expected KEY=VALUE[,VALUE…] (e.g. \"threads=1\"), got {show(item)}")
            good = False
        elif key.strip() != "cell" and key.strip() not in PARAMS:
            errors.add(at, f"unknown parameter {show(key.strip())}; expected cell or a parameter of "
                           "docs/MATRIX.md")
            good = False
    return tuple(items) if good else None


def _path(value: Any, base: Path) -> tuple[Path | None, str | None]:
    """A path value: ``~`` expanded, relative to ``base``; or the problem with it."""
    if not isinstance(value, str) or not value.strip():
        return None, f"expected a path, got {show(value)}"
    if _CONTROL.search(value):
        return None, f"expected a path without control characters, got {show(value)}"
    try:
        p = Path(value).expanduser()
    except RuntimeError:  # "~user" of no such user, or no home directory
        return None, f"cannot expand {show(value.split('/', 1)[0])}: no such user's home directory"
    # normalised: a container sees only the mounted folders, so `a/../results` (with `a`
    # unmounted) must reach it as `results`; the same path inside and outside
    p = Path(os.path.normpath(p if p.is_absolute() else base / p))
    problem = path_problem(str(p))
    return (None, problem) if problem else (p, None)


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot name a file on Linux, or None: a NUL or other control character,
    a component over ``MAX_PATH_COMPONENT_BYTES`` bytes, the whole over ``MAX_PATH_BYTES``."""
    if _CONTROL.search(path):
        return f"expected a path without control characters, got {show(path)}"
    try:
        encoded = os.fsencode(path)
    except UnicodeError:
        return f"expected a path of UTF-8 text, got {show(path)}"
    if len(encoded) > MAX_PATH_BYTES:
        return (f"is a path of {len(encoded):,} bytes ({show(path)}); a path may have at most "
                f"{MAX_PATH_BYTES:,}")
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > MAX_PATH_COMPONENT_BYTES:
        name = show(os.fsdecode(longest))
        return (f"has a file name of {len(longest):,} bytes ({name}); a name may have at most "
                f"{MAX_PATH_COMPONENT_BYTES}")
    return None


def _check_nesting(doc: Mapping[str, Any], errors: _Errors) -> None:
    """Refuse tables and arrays nested deeper than ``MAX_NESTING``, before anything formats
    or compares such values (iterative: the check itself cannot run out of stack)."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        where, value = stack.pop()
        if not isinstance(value, (dict, list)):
            continue
        if len(where) > MAX_NESTING:
            errors.add(where, f"nests tables and arrays more than {MAX_NESTING} deep")
            continue
        members = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((where + (k,), v) for k, v in members if isinstance(v, (dict, list)))


def _check_value(where: tuple[Any, ...], key: str, value: Any, errors: _Errors) -> Any:
    param = PARAMS.get(key)
    if param is None:
        errors.add(where, f"unknown parameter; known: {', '.join(PARAMS)}")
        return None
    try:
        return param.check(value)
    except ParamError as exc:
        errors.add(where, str(exc))
        return None


def _parse_fixed(raw: Any, errors: _Errors) -> dict[str, Any]:
    if not isinstance(raw, dict):
        errors.add(("fixed",), f"expected a table of parameter = value, got {show(raw)}")
        return {}
    return {k: _check_value(("fixed", k), k, v, errors) for k, v in raw.items()}


def _parse_list(where: tuple[Any, ...], key: str, values: Any, errors: _Errors, *, unique: bool = True) -> list[Any]:
    if not isinstance(values, list):
        errors.add(where, f"expected a list of values, got {show(values)}")
        return []
    if not values:
        errors.add(where, "is empty: an axis needs at least one value")
        return []
    if len(values) > MAX_CELLS_CEILING:
        errors.add(where, f"has {len(values):,} values; a matrix has at most {MAX_CELLS_CEILING:,} cells")
        return []
    if key not in PARAMS:
        errors.add(where, f"unknown parameter; known: {', '.join(PARAMS)}")
        return []
    checked = [_check_value((*where, i), key, v, errors) for i, v in enumerate(values)]
    if unique and len({repr(v) for v in checked}) != len(checked):
        errors.add(where, "lists the same value twice")
    return checked


def _parse_axes(raw: Any, errors: _Errors) -> dict[str, list[Any]]:
    if not isinstance(raw, dict):
        errors.add(("axes",), f"expected a table of parameter = [values], got {show(raw)}")
        return {}
    return {k: _parse_list(("axes", k), k, v, errors) for k, v in raw.items()}


def _parse_zips(raw: Any, errors: _Errors) -> list[dict[str, list[Any]]]:
    if not isinstance(raw, list):
        errors.add(("zip",), "expected [[zip]] tables of parameter = [values] of equal length")
        return []
    groups = []
    for n, group in enumerate(raw):
        if not isinstance(group, dict) or not group:
            errors.add(("zip", n), "expected a table of parameter = [values] of equal length")
            continue
        # Within a zip a value may repeat (batch 64 with two learning rates); rows may not.
        parsed = {k: _parse_list(("zip", n, k), k, v, errors, unique=False) for k, v in group.items()}
        lengths = {k: len(v) for k, v in parsed.items()}
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"{k} has {n_}" for k, n_ in lengths.items())
            errors.add(("zip", n), f"zipped lists must have the same length: {listed}")
        elif len({repr(row) for row in zip(*parsed.values())}) != _zip_len(parsed):
            errors.add(("zip", n), "lists the same combination twice")
        groups.append(parsed)
    return groups


def _parse_rows(raw: Any, section: str, errors: _Errors, *, lists: bool) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        errors.add((section,), f"expected [[{section}]] tables")
        return []
    limit = MAX_EXCLUDES if section == "exclude" else MAX_CELLS_CEILING
    if len(raw) > limit:
        errors.add((section,), f"has {len(raw):,} [[{section}]] tables; at most {limit:,}")
        return []
    rows = []
    for n, row in enumerate(raw):
        if not isinstance(row, dict) or not row:
            errors.add((section, n), "expected a non-empty table of parameter = value")
            continue
        parsed: dict[str, Any] = {}
        for k, v in row.items():
            if lists and isinstance(v, list) and k != "synthetic_shape":
                parsed[k] = tuple(_check_value((section, n, k, i), k, x, errors) for i, x in enumerate(v))
            else:
                parsed[k] = _check_value((section, n, k), k, v, errors)
        rows.append(parsed)
    return rows


def _check_overlaps(fixed: dict[str, Any], axes: dict[str, list[Any]],
                    zips: list[dict[str, list[Any]]], errors: _Errors) -> None:
    owners: dict[str, tuple[Any, ...]] = {k: ("fixed", k) for k in fixed}
    for k in axes:
        if k in owners:
            errors.add(("axes", k), f"is also set in [{' -> '.join(map(str, owners[k]))}]; set it in one place")
        owners[k] = ("axes", k)
    for n, group in enumerate(zips):
        for k in group:
            if k in owners:
                errors.add(("zip", n, k), f"is also set in [{' -> '.join(map(str, owners[k]))}]; set it in one place")
            owners[k] = ("zip", n, k)


def _zip_len(group: dict[str, list[Any]]) -> int:
    return min((len(v) for v in group.values()), default=0)


def _matches(combo: dict[str, Any], rule: dict[str, Any], fixed: dict[str, Any]) -> bool:
    for key, wanted in rule.items():
        have = combo.get(key, fixed.get(key, PARAMS[key].default))
        options = wanted if isinstance(wanted, tuple) else (wanted,)
        if have not in options:
            return False
    return True


def _describe(combo: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k} = {show(v)}" for k, v in combo.items()) + "}"


def iter_runs(cells: tuple[CellParams, ...], repeats: int) -> Iterator[tuple[CellParams, int]]:
    """Cells in order, each repeat after the other (repeat-major keeps the sweep fair)."""
    for repeat in range(repeats):
        for cell in cells:
            yield cell, repeat
