"""Finding, reading and validating result bundles (the layout is ``layout``, the format
docs/BUNDLE.md).

Everything here is read-only and independent of DuckDB: ``ingest`` parses every bundle
with :func:`load_bundle` first, then writes the parsed ones in one transaction.

A bundle that cannot be trusted raises :class:`BadBundle` (a ``BundleError``) naming the
file and what is wrong with it; a bundle without ``result.json`` raises the subclass
:class:`BundleIncomplete`, because a run that never finished is not corrupt.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from matrun.errors import BundleError, InputError
from matrun.warehouse.bundles.layout import (
    EVENTS, MONITOR, RESULT, SCHEMA_VERSION, SPEC, STATUSES, RunKey, run_dir_name,
)

#: No bundle file may be larger than this; a bigger one is refused, not read into memory.
MAX_FILE_BYTES = 512 * 2**20

#: Files whose bytes make up a bundle's digest, in this order.
DIGEST_FILES = (SPEC, EVENTS, MONITOR, RESULT)

# Record checks: key -> kind.  "int" / "num" / "str" / "bool" must be present and of that
# type; a trailing "?" also allows null or a missing key.
_Spec = dict[str, str]
_SPEC_KEYS: _Spec = {"sweep": "str", "cell_id": "str", "repeat": "int", "attempt": "int",
                     "env_id": "str", "params": "obj"}
_RESULT_KEYS: _Spec = {"sweep": "str", "cell_id": "str", "repeat": "int", "attempt": "int",
                       "env_id": "str", "executor": "str", "status": "str", "exit_code": "int?",
                       "error_tail": "str?", "started_at": "time", "ended_at": "time?",
                       "wall_seconds": "num?", "host": "obj?", "monitor": "obj?"}
_STEP_KEYS: _Spec = {"epoch": "int?", "step": "int", "phase": "str", "seconds": "num",
                     "images": "int"}
_EPOCH_KEYS: _Spec = {"epoch": "int", "steps": "int?", "train_loss": "num?",
                      "train_accuracy": "num?", "test_loss": "num?", "test_accuracy": "num?",
                      "epoch_seconds": "num?", "test_seconds": "num?"}
_SUMMARY_KEYS: _Spec = {"train_seconds": "num?", "test_seconds": "num?", "accuracy": "num?",
                        "throughput": "num?", "time_to_first_step": "num?",
                        "timed_steps": "int?", "warmup_steps": "int?", "diverged": "bool?"}
_LAYER_KEYS: _Spec = {"name": "str", "kind": "str", "index": "int?", "forward_seconds": "num?",
                      "backward_seconds": "num?", "repeats": "int?", "params": "int?", "flops": "int?"}
_SAMPLE_KEYS: _Spec = {"t": "num", "cpu_user": "num?", "cpu_system": "num?", "iowait": "num?",
                       "rss_bytes": "int?", "nprocs": "int?"}
_PHASES = ("warmup", "timed")


class BadBundle(BundleError):
    """One file of a bundle (or its directory) is wrong; ``short()`` is the reason alone."""

    def __init__(self, file: Path, problem: str) -> None:
        self.file = file
        self.problem = problem
        super().__init__(f"{file}: {problem}")

    def short(self) -> str:
        """The reason relative to the bundle: ``"result.json: <problem>"``."""
        return f"{self.file.name}: {self.problem}"


class BundleIncomplete(BadBundle):
    """The bundle has no ``result.json``: the run never finished, or is still running."""


@dataclass
class Bundle:
    """One parsed, validated bundle.  Records keep the keys they had on disk."""

    path: Path
    key: RunKey
    spec: dict[str, Any]
    result: dict[str, Any]
    digest: str
    header: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    layers: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    monitor_header: dict[str, Any] = field(default_factory=dict)
    monitor_samples: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.key.run_id

    @property
    def status(self) -> str:
        return str(self.result["status"])


def find_bundles(root: Path | str) -> Iterator[Path]:
    """Every bundle directory (one holding ``spec.json``) under ``root``, sorted.

    ``root`` may itself be a bundle.  Symbolic links to directories are not followed, so a
    link cannot pull bundles from outside the tree into an ingest.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: no such directory")
    found: list[Path] = []
    for current, dirnames, filenames in os.walk(root, followlinks=False):
        if SPEC in filenames:
            found.append(Path(current))
            dirnames[:] = []  # bundles do not nest
        else:
            dirnames.sort()
    yield from sorted(found)


def load_bundle(directory: Path | str) -> Bundle:
    """Parse and validate one bundle; raise :class:`BadBundle` naming the file at fault."""
    directory = Path(directory)
    raw = {name: _read_file(directory / name) for name in DIGEST_FILES}
    if raw[SPEC] is None:
        raise BadBundle(directory / SPEC, "missing: this directory is not a bundle")
    if raw[RESULT] is None:
        raise BundleIncomplete(directory / RESULT,
                               "missing: the run never finished (or is still running)")
    spec = _parse_json(directory / SPEC, raw[SPEC], _SPEC_KEYS)
    result = _parse_json(directory / RESULT, raw[RESULT], _RESULT_KEYS)
    status = result["status"]
    if status not in STATUSES:
        raise BadBundle(directory / RESULT,
                        f"status {status!r} is not one of {', '.join(STATUSES)}")
    key = _check_identity(directory, spec, result)

    bundle = Bundle(path=directory, key=key, spec=spec, result=result, digest=_digest(raw))
    _read_events(bundle, directory / EVENTS, raw[EVENTS], finished_ok=status == "ok")
    _read_monitor(bundle, directory / MONITOR, raw[MONITOR], finished_ok=status == "ok")
    if status == "ok" and bundle.summary is None:
        raise BadBundle(directory / EVENTS,
                        "has no summary record, but result.json says status ok")
    return bundle


# -- files -------------------------------------------------------------------------------


def _read_file(path: Path) -> bytes | None:
    """The file's bytes, or None when it does not exist.  Links and huge files are refused."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise BadBundle(path, "is a symbolic link; bundle files must be regular files")
    if not stat.S_ISREG(info.st_mode):
        raise BadBundle(path, "is not a regular file")
    if info.st_size > MAX_FILE_BYTES:
        raise BadBundle(path, f"is {_size(info.st_size)}, over the {_size(MAX_FILE_BYTES)} "
                              "limit for a bundle file")
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise BadBundle(path, f"cannot be read: {exc.strerror}") from None


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def _digest(raw: dict[str, bytes | None]) -> str:
    """sha256 over the digest files, each framed by its name and length (absent = empty)."""
    h = hashlib.sha256()
    for name in DIGEST_FILES:
        data = raw[name] or b""
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _parse_json(path: Path, data: bytes, keys: _Spec) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except UnicodeDecodeError:
        raise BadBundle(path, "is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise BadBundle(path, f"invalid JSON at line {exc.lineno}, column {exc.colno}: "
                              f"{exc.msg}") from None
    if not isinstance(obj, dict):
        raise BadBundle(path, "is not a JSON object")
    _check_version(path, obj)
    problem = _check_record(obj, keys)
    if problem:
        raise BadBundle(path, problem)
    return obj


def _check_version(path: Path, obj: dict[str, Any]) -> None:
    if "schema_version" not in obj:
        raise BadBundle(path, "is missing required key 'schema_version'")
    version = obj["schema_version"]
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise BadBundle(path, f"has schema_version {json.dumps(version)}; this matrun reads "
                              f"{SCHEMA_VERSION}: upgrade matrun")


def _check_record(obj: dict[str, Any], keys: _Spec) -> str | None:
    """None when ``obj`` fits ``keys``, else what is wrong with it."""
    for key, kind in keys.items():
        optional = kind.endswith("?")
        if key not in obj:
            if optional:
                continue
            return f"is missing required key {key!r}"
        value = obj[key]
        if value is None and optional:
            continue
        if not _KIND_CHECKS[kind.rstrip("?")](value):
            return f"key {key!r} should be {_KIND_NAMES[kind.rstrip('?')]}, got {json.dumps(value)}"
    return None


def _is_time(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False


_KIND_CHECKS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "num": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "obj": lambda v: isinstance(v, dict),
    "time": _is_time,
}
_KIND_NAMES = {"int": "an integer", "num": "a number", "str": "a string", "bool": "true or false",
               "obj": "an object", "time": "an ISO 8601 time with a UTC offset"}


def _check_identity(directory: Path, spec: dict[str, Any], result: dict[str, Any]) -> RunKey:
    """spec.json, result.json and the directory must all name the same run."""
    for key in ("sweep", "cell_id", "repeat", "attempt", "env_id"):
        if spec[key] != result[key]:
            raise BadBundle(directory / RESULT, f"{key} is {json.dumps(result[key])} but "
                                                f"spec.json says {json.dumps(spec[key])}")
    run = RunKey(spec["sweep"], spec["cell_id"], spec["repeat"], spec["attempt"])
    expected = run_dir_name(run.repeat, run.attempt)
    if directory.name != expected:
        raise BadBundle(directory, f"directory name does not match spec.json (repeat "
                                   f"{run.repeat}, attempt {run.attempt}: expected {expected!r})")
    if directory.parent.name != run.cell_id:
        raise BadBundle(directory, f"is not inside a folder named after its cell_id "
                                   f"{run.cell_id!r} (found {directory.parent.name!r})")
    return run


# -- JSON-lines files --------------------------------------------------------------------


def _jsonl_records(path: Path, data: bytes, *, finished_ok: bool,
                   warnings: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each line after the header, which is checked here.

    A final line that does not parse and has no newline was cut off mid-write: tolerated
    (and reported as a warning) for a run that did not finish ok, an error for one that did.
    """
    lines = data.split(b"\n")
    ends_cleanly = lines[-1] == b""
    if ends_cleanly:
        lines.pop()
    last = len(lines)
    for number, line in enumerate(lines, start=1):
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if number == last and not ends_cleanly:
                if finished_ok:
                    raise BadBundle(path, f"line {number} is truncated (the file ends "
                                          "mid-record) but result.json says status ok") from None
                warnings.append(f"{path.name}: ignored truncated line {number}")
                return
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise BadBundle(path, f"invalid JSON at line {number}: {reason}") from None
        if not isinstance(obj, dict):
            raise BadBundle(path, f"line {number} is not a JSON object")
        if number == 1:
            if obj.get("type") != "header":
                raise BadBundle(path, "line 1 is not a header record")
            _check_version(path, obj)
        yield number, obj


def _read_events(bundle: Bundle, path: Path, data: bytes | None, *, finished_ok: bool) -> None:
    if not data:
        if finished_ok:
            raise BadBundle(path, "is missing or empty, but result.json says status ok")
        return
    checks = {"step": _STEP_KEYS, "epoch": _EPOCH_KEYS, "summary": _SUMMARY_KEYS, "layer": _LAYER_KEYS}
    for number, record in _jsonl_records(path, data, finished_ok=finished_ok,
                                         warnings=bundle.warnings):
        kind = record.get("type")
        if number == 1:
            bundle.header = record
            continue
        if kind in checks:
            problem = _check_record(record, checks[kind])
            if problem:
                raise BadBundle(path, f"line {number}: {kind} record {problem}")
        if kind == "step":
            if record["phase"] not in _PHASES:
                raise BadBundle(path, f"line {number}: step phase {record['phase']!r} is not "
                                      "'warmup' or 'timed'")
            bundle.steps.append(record)
        elif kind == "epoch":
            bundle.epochs.append(record)
        elif kind == "layer":
            bundle.layers.append(record)
        elif kind == "summary":
            bundle.summary = record
        elif kind == "probe":
            mismatches = record.get("mismatches", [])
            if not isinstance(mismatches, list) or not all(isinstance(m, str) for m in mismatches):
                raise BadBundle(path, f"line {number}: probe mismatches should be a list of "
                                      "strings")
            bundle.probe = record
        elif kind == "data":
            bundle.data = record
        elif kind == "model":
            bundle.model = record
        # "end" and record types from newer harnesses of the same schema are ignored.


def _read_monitor(bundle: Bundle, path: Path, data: bytes | None, *, finished_ok: bool) -> None:
    if not data:  # a run can end before the monitor's first write; aggregates live in result
        return
    for number, record in _jsonl_records(path, data, finished_ok=finished_ok,
                                         warnings=bundle.warnings):
        if number == 1:
            bundle.monitor_header = record
            continue
        problem = _check_record(record, _SAMPLE_KEYS)
        if problem:
            raise BadBundle(path, f"line {number}: sample {problem}")
        bundle.monitor_samples.append(record)
