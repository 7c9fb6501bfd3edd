"""Finding, reading and validating result bundles (the layout is ``layout``, the format
docs/BUNDLE.md).

Everything here is read-only and independent of DuckDB: ``ingest`` parses every bundle
with :func:`load_bundle` first, then writes the parsed ones in one transaction.

A bundle that cannot be trusted raises :class:`BadBundle` (a ``BundleError``) naming the
file, the key and what is wrong with it; a bundle without ``result.json`` raises the
subclass :class:`BundleIncomplete`, because a run that never finished is not corrupt.

Each bundle is validated on its own, whole, before anything of it reaches a table
(docs/BUNDLE.md "Validation"): the files' sizes, the nesting of their JSON (checked by a
scan of the brackets before ``json.loads``, which would otherwise recurse), every string's
length, every array's and object's size, every integer within the range of its warehouse
column (64-bit anywhere else), every number finite but a diverged run's losses and
accuracies (read as null), every time within the years 1 to 9999 in UTC.  :func:`loads`,
the JSON parsing under it, is public for the other readers of a results directory.

The JSON-lines files are read in blocks of whole lines (``BLOCK_BYTES``), hashed into the
digest as they are read, so a bundle's largest file is never held whole, nor its millions
of records as Python objects.  Their bulk — step records, monitor samples — is read many
lines at a time: a line exactly as its writer formats it (``json.dumps``, keys in the
writer's order) is matched by a regular expression and its values cut out and converted by
Arrow, into a record batch of the warehouse's column types (``Bundle.steps``,
``Bundle.monitor_samples``).  Every other line — the few other records, and any step or
sample written otherwise — is read exactly, one at a time; and a block holding anything
the bulk reading cannot vouch for (a row not in the writer's format, an integer beyond its
column, a number beyond a double) is read exactly, line by line, so a fault is reported
with the same line, key and words whichever way its block was read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from matrun.errors import BundleError, InputError
from matrun.runner.harness.phases import PHASES as PHASE_NAMES, known as phase_known  # stdlib only
from matrun.warehouse.bundles.layout import (
    EVENTS, GPU, MONITOR, QUARANTINE, RESULT, SCHEMA_VERSION, SPEC, STATUSES, RunKey, run_dir_name,
)

#: No JSON-lines file of a bundle (events.jsonl, monitor.jsonl) may be larger than this; a
#: bigger one is refused, not read into memory.
MAX_FILE_BYTES = 512 * 2**20
#: spec.json and result.json are small; a larger one is refused.
MAX_JSON_FILE_BYTES = 16 * 2**20
#: Arrays and objects nested in one JSON value (a record is depth 1).
MAX_DEPTH = 64
#: Characters of one string, value or key.
MAX_STRING_CHARS = 2**20
#: Members of one array or object.
MAX_ITEMS = 2**20
#: Integers of INTEGER columns (repeat, attempt, exit_code, steps, epochs, …).
INT32 = (-(2**31), 2**31 - 1)
#: Integers of BIGINT columns (rss_bytes, params, flops), and every other integer of a bundle
#: (the JSON columns: DuckDB reads their numbers as 64-bit).
INT64 = (-(2**63), 2**63 - 1)

#: Files whose bytes make up a bundle's digest, in this order; and the optional ones, which
#: enter the digest (and the signature) only when present, so the bundles written before them
#: keep theirs.
DIGEST_FILES = (SPEC, EVENTS, MONITOR, RESULT)
OPTIONAL_FILES = (GPU,)
#: JSON-lines files are read this many bytes at a time (a block ends at a line's end; a longer
#: line makes a longer block).
BLOCK_BYTES = 16 * 2**20

# Record checks: key -> kind.  "int" (an INTEGER column) / "int64" (a BIGINT column) / "num"
# (a finite number) / "str" / "bool" / "obj" / "list" / "time" must be present and of that kind;
# "metric" is a number that may be NaN or infinite in a diverged run (read as null); a
# trailing "?" also allows null or a missing key.
_Spec = dict[str, str]
_SPEC_KEYS: _Spec = {"sweep": "str", "cell_id": "str", "repeat": "int", "attempt": "int",
                     "env_id": "str", "params": "obj"}
_RESULT_KEYS: _Spec = {"sweep": "str", "cell_id": "str", "repeat": "int", "attempt": "int",
                       "env_id": "str", "executor": "str", "status": "str", "exit_code": "int?",
                       "error_tail": "str?", "started_at": "time", "ended_at": "time?",
                       "wall_seconds": "num?", "host": "obj?", "monitor": "obj?"}
_MONITOR_KEYS: _Spec = {"interval_s": "num?", "samples": "int?", "cpu_user_avg": "num?",
                        "cpu_system_avg": "num?", "cpu_total_avg": "num?", "iowait_avg": "num?",
                        "rss_avg_bytes": "num?", "rss_peak_bytes": "int64?",
                        # the GPU and energy monitor's (runner/executors/energy.py)
                        "gpu_count": "int?", "gpu_samples": "int?", "gpu_util_avg": "num?",
                        "gpu_mem_used_peak_bytes": "int64?", "gpu_power_avg_w": "num?",
                        "gpu_energy_j": "num?", "gpu_energy_source": "str?", "gpu_throttled": "bool?",
                        "gpu_throttle_reasons": "list?", "cpu_energy_j": "num?",
                        "cpu_energy_source": "str?", "energy_note": "str?"}
# The cell parameters a view casts to INTEGER (the others it reads with TRY_CAST).
_PARAMS_KEYS: _Spec = {"batch_size": "int?"}
# The probe's list a view casts to a JSON array.
_PROBE_KEYS: _Spec = {"libraries": "list?"}
_STEP_KEYS: _Spec = {"epoch": "int?", "step": "int", "phase": "str", "seconds": "num",
                     "images": "int"}
_EPOCH_KEYS: _Spec = {"epoch": "int", "steps": "int?", "train_loss": "metric?",
                      "train_accuracy": "metric?", "test_loss": "metric?",
                      "test_accuracy": "metric?", "epoch_seconds": "num?", "test_seconds": "num?"}
_SUMMARY_KEYS: _Spec = {"train_seconds": "num?", "test_seconds": "num?", "accuracy": "metric?",
                        "throughput": "num?", "time_to_first_step": "num?",
                        "timed_steps": "int?", "warmup_steps": "int?", "diverged": "bool?"}
_LAYER_KEYS: _Spec = {"name": "str", "kind": "str", "index": "int?", "forward_seconds": "num?",
                      "backward_seconds": "num?", "repeats": "int?", "params": "int64?",
                      "flops": "int64?"}
_SAMPLE_KEYS: _Spec = {"t": "num", "cpu_user": "num?", "cpu_system": "num?", "iowait": "num?",
                       "rss_bytes": "int64?", "nprocs": "int?"}
_GPU_KEYS: _Spec = {"t": "num", "gpu": "int", "util": "num?", "mem_util": "num?",
                    "mem_used_bytes": "int64?", "power_w": "num?", "energy_j": "num?",
                    "sm_clock_mhz": "int?", "mem_clock_mhz": "int?", "temp_c": "num?", "throttle": "int64?"}
_PHASE_KEYS: _Spec = {"step": "int", "seconds": "num", "phases": "obj"}
#: Step phases: the warm-up, the timed steps, and the timed steps sampled for their phases
#: (kept out of the throughput, docs/MODEL.md).
_PHASES = ("warmup", "timed", "sampled")


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


#: Records read in bulk (``Bundle.steps``, ``Bundle.monitor_samples``), in file order: Arrow
#: record batches of the columns the warehouse keeps (``STEP_COLUMNS``, ``SAMPLE_COLUMNS``),
#: or a list of the records themselves where Arrow could not put a value in its column (an
#: integer step time beyond 2**53: ``rows`` then names the value).
Rows = list[pa.RecordBatch | list[dict[str, Any]]]


@dataclass
class Bundle:
    """One parsed, validated bundle.  Records keep the keys they had on disk; the bulk of them
    (steps, monitor samples) are ``Rows``.  ``signature`` is :func:`bundle_signature`, taken
    before any file was read."""

    path: Path
    key: RunKey
    spec: dict[str, Any]
    result: dict[str, Any]
    digest: str
    signature: str = ""
    header: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    steps: Rows = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    layers: list[dict[str, Any]] = field(default_factory=list)
    # one row per phase of each sampled step: {step, ordinal, phase, seconds, step_seconds}
    phases: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    monitor_header: dict[str, Any] = field(default_factory=dict)
    monitor_samples: Rows = field(default_factory=list)
    gpu_header: dict[str, Any] = field(default_factory=dict)
    gpu_samples: Rows = field(default_factory=list)
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
    link cannot pull bundles from outside the tree into an ingest.  Quarantine folders
    (``.quarantine``, ``quarantine.py``) below ``root`` are not entered: their bundles were set
    aside; ``root`` itself may be one, to load a bundle fixed there.
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
            dirnames[:] = sorted(name for name in dirnames if name != QUARANTINE)
    yield from sorted(found)


def bundle_signature(directory: Path | str) -> str:
    """What a bundle's files are, from their metadata alone (nothing is read): for each of
    spec.json, events.jsonl, monitor.jsonl and result.json, ``name:size:mtime_ns:inode:ctime_ns``
    (links not followed), or ``name:absent`` when it cannot be stat'ed, then the same of each
    optional file present (gpu.jsonl); joined by ``;``.  A
    file rewritten, replaced or touched changes it, so an unchanged signature means the bundle
    need not be read again."""
    parts = []
    for name in DIGEST_FILES:
        try:
            info = os.lstat(Path(directory) / name)
        except OSError:  # reading the bundle says why
            parts.append(f"{name}:absent")
            continue
        parts.append(f"{name}:{info.st_size}:{info.st_mtime_ns}:{info.st_ino}:{info.st_ctime_ns}")
    for name in OPTIONAL_FILES:
        try:
            info = os.lstat(Path(directory) / name)
        except OSError:
            continue
        parts.append(f"{name}:{info.st_size}:{info.st_mtime_ns}:{info.st_ino}:{info.st_ctime_ns}")
    return ";".join(parts)


def load_bundle(directory: Path | str) -> Bundle:
    """Parse and validate one bundle; raise :class:`BadBundle` naming the file at fault."""
    directory = Path(directory)
    signature = bundle_signature(directory)  # before reading: a file changed meanwhile is read again
    with ExitStack() as stack:
        files = {name: _open(directory / name, stack) for name in DIGEST_FILES + OPTIONAL_FILES}
        spec_file, result_file = files[SPEC], files[RESULT]
        if spec_file is None:
            raise BadBundle(directory / SPEC, "missing: this directory is not a bundle")
        if result_file is None:
            raise BundleIncomplete(directory / RESULT,
                                   "missing: the run never finished (or is still running)")
        spec_raw = _read_whole(directory / SPEC, spec_file)
        result_raw = _read_whole(directory / RESULT, result_file)
        spec = _parse_json(directory / SPEC, spec_raw, _SPEC_KEYS, inner=("params", _PARAMS_KEYS))
        result = _parse_json(directory / RESULT, result_raw, _RESULT_KEYS, inner=("monitor", _MONITOR_KEYS))
        status = result["status"]
        if status not in STATUSES:
            raise BadBundle(directory / RESULT,
                            f"status {status[:60]!r} is not one of {', '.join(STATUSES)}")
        key = _check_identity(directory, spec, result)

        bundle = Bundle(path=directory, key=key, spec=spec, result=result, digest="",
                        signature=signature)
        digest = hashlib.sha256(_frame(SPEC, len(spec_raw)) + spec_raw)
        _read_events(bundle, directory / EVENTS, files[EVENTS], digest, finished_ok=status == "ok")
        _read_monitor(bundle, directory / MONITOR, files[MONITOR], digest, finished_ok=status == "ok")
        _read_gpu(bundle, directory / GPU, files[GPU], digest, finished_ok=status == "ok")
        digest.update(_frame(RESULT, len(result_raw)) + result_raw)
        bundle.digest = digest.hexdigest()
    if status == "ok" and bundle.summary is None:
        raise BadBundle(directory / EVENTS,
                        "has no summary record, but result.json says status ok")
    return bundle


# -- files -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _File:
    """A bundle file opened for reading, and its size when it was opened."""

    handle: BinaryIO
    size: int


def _open(path: Path, stack: ExitStack) -> _File | None:
    """The file opened (closed with ``stack``), or None when it does not exist.  Links and
    huge files are refused."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise BadBundle(path, "is a symbolic link; bundle files must be regular files")
    if not stat.S_ISREG(info.st_mode):
        raise BadBundle(path, "is not a regular file")
    limit = MAX_JSON_FILE_BYTES if path.name in (SPEC, RESULT) else MAX_FILE_BYTES
    _check_size(path, info.st_size, limit)
    try:
        handle = stack.enter_context(open(path, "rb"))
        size = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise BadBundle(path, f"cannot be read: {exc.strerror}") from None
    _check_size(path, size, limit)  # it may have grown since
    return _File(handle, size)


def _check_size(path: Path, size: int, limit: int) -> None:
    if size > limit:
        raise BadBundle(path, f"is {_size(size)}, over the {_size(limit)} limit for a bundle file")


def _read_whole(path: Path, file: _File) -> bytes:
    """A small file's bytes (spec.json, result.json)."""
    try:
        return file.handle.read(MAX_JSON_FILE_BYTES + 1)
    except OSError as exc:
        raise BadBundle(path, f"cannot be read: {exc.strerror}") from None


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def _frame(name: str, size: int) -> bytes:
    """What precedes a file's bytes in the digest: sha256 over the digest files in order, each
    framed by its name and length (an absent file is empty)."""
    return f"{name}\0{size}\0".encode()


def _blocks(path: Path, file: _File, digest: Any) -> Iterator[tuple[int, bytes, bool]]:
    """The file's first ``file.size`` bytes in blocks of whole lines, each with the number of
    its first line and whether it ends the file without a newline (a last line cut off
    mid-write).  Every byte goes into ``digest`` as it is read."""
    number, carry, left = 1, b"", file.size
    while left:
        try:
            chunk = file.handle.read(min(BLOCK_BYTES, left))
        except OSError as exc:
            raise BadBundle(path, f"cannot be read: {exc.strerror}") from None
        if not chunk:
            raise BadBundle(path, f"became shorter while it was read ({file.size} bytes, then "
                                  f"{file.size - left}): read it again")
        left -= len(chunk)
        digest.update(chunk)
        data = carry + chunk if carry else chunk
        end = data.rfind(b"\n") + 1 if left else len(data)
        carry = data[end:]
        if end:
            block = data if end == len(data) else data[:end]
            yield number, block, not left and not block.endswith(b"\n")
            if left:
                number += block.count(b"\n")


# -- JSON text ---------------------------------------------------------------------------


class _Refused(ValueError):
    """JSON text refused for something other than its syntax (the message says what)."""


class _NonFinite(float):
    """A number JSON cannot hold as a double (``NaN``, ``Infinity``, ``1e400``), with its text."""

    text: str

    def __new__(cls, text: str) -> "_NonFinite":
        value = super().__new__(cls, float(text))
        value.text = text
        return value


def _parse_float(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


# A JSON string (an unterminated one runs to the end: the scan never backtracks) or a bracket.
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)|[\[\]{}]', re.S)
_OPENERS = (b"[", b"{")
_CLOSERS = (b"]", b"}")


def _nesting_problem(data: bytes) -> str | None:
    """Why ``data`` nests arrays and objects too deeply for ``json.loads`` (which recurses
    once per level), or None.  A scan of the brackets outside strings, without recursion;
    text with fewer brackets than the limit is not scanned at all."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return None
    depth = 0
    for match in _JSON_TOKEN.finditer(data):
        token = match.group()
        if token in _OPENERS:
            depth += 1
            if depth > MAX_DEPTH:
                offset = match.start()
                line = data.count(b"\n", 0, offset) + 1
                column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
                place = f"line {line}, column {column}" if b"\n" in data else f"column {column}"
                return f"nests arrays and objects more than {MAX_DEPTH} deep (at {place})"
        elif token in _CLOSERS:
            depth -= 1
    return None


def loads(data: bytes) -> Any:
    """``json.loads`` for a file a damaged or hostile writer may have left in a results
    directory: a ``ValueError`` — never a ``RecursionError`` — for text nested more than
    ``MAX_DEPTH`` deep or an integer of more digits than Python reads (whose message says
    which), a ``JSONDecodeError`` / ``UnicodeDecodeError`` (also ``ValueError``) for bad
    syntax.  Non-finite numbers come back as floats; ``load_bundle`` then refuses them."""
    problem = _nesting_problem(data)
    if problem:
        raise _Refused(problem)
    try:
        return json.loads(data, parse_float=_parse_float, parse_constant=_NonFinite)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except RecursionError:  # the scan above should make this impossible; never a traceback
        raise _Refused("nests arrays and objects too deeply") from None
    except ValueError:  # Python's limit on the digits of an integer
        raise _Refused("has an integer of more digits than Python reads (4300)") from None


def _parse_json(path: Path, data: bytes, keys: _Spec, *, inner: tuple[str, _Spec]) -> dict[str, Any]:
    """A JSON file's object: its typed ``keys``, those of the object under ``inner``'s key, then
    the bundle-wide limits over all of it."""
    try:
        obj = loads(data)
    except _Refused as exc:
        raise BadBundle(path, str(exc)) from None
    except UnicodeDecodeError:
        raise BadBundle(path, "is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise BadBundle(path, f"invalid JSON at line {exc.lineno}, column {exc.colno}: "
                              f"{exc.msg}") from None
    if not isinstance(obj, dict):
        raise BadBundle(path, "is not a JSON object")
    _check_version(path, obj)
    key, inner_keys = inner
    nested = obj.get(key)
    problem = (_check_record(obj, keys)
               or (_check_record(nested, inner_keys, prefix=f"{key} -> ") if isinstance(nested, dict) else None)
               or _value_problem(obj))
    if problem:
        raise BadBundle(path, problem)
    return obj


def _check_version(path: Path, obj: dict[str, Any]) -> None:
    if "schema_version" not in obj:
        raise BadBundle(path, "is missing required key 'schema_version'")
    version = obj["schema_version"]
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise BadBundle(path, f"has schema_version {_show(version)}; this matrun reads "
                              f"{SCHEMA_VERSION}: upgrade matrun")


# -- values ------------------------------------------------------------------------------


def _check_record(obj: dict[str, Any], keys: _Spec, prefix: str = "") -> str | None:
    """None when ``obj`` fits ``keys``, else what is wrong with it.  A "metric" that is NaN
    or infinite (a diverged run) is set to None here: the warehouse stores it as null."""
    for key, kind in keys.items():
        optional = kind.endswith("?")
        kind = kind.rstrip("?")
        if key not in obj:
            if optional:
                continue
            return f"is missing required key {prefix + key!r}"
        value = obj[key]
        if value is None and optional:
            continue
        if not _KIND_CHECKS[kind](value):
            return f"key {prefix + key!r} should be {_KIND_NAMES[kind]}, got {_show(value)}"
        if kind == "metric" and not math.isfinite(value):
            obj[key] = None
        elif kind in _INT_RANGES and not _INT_RANGES[kind][0] <= value <= _INT_RANGES[kind][1]:
            low, high = _INT_RANGES[kind]
            return (f"key {prefix + key!r} is {_show(value)}, outside the range of its warehouse "
                    f"column ({low:,} to {high:,})")
        elif kind == "num" and not math.isfinite(value):
            return f"key {prefix + key!r} is {_show(value)}: {_NOT_FINITE}"
        elif kind == "time" and not _in_utc_range(value):
            return (f"key {prefix + key!r} is {_show(value)}, outside the years 1 to 9999 in UTC "
                    "(a warehouse time)")
    return None


_NOT_FINITE = "it must be a finite number (docs/BUNDLE.md \"Validation\")"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _value_problem(value: Any) -> str | None:
    """What breaks the bundle-wide limits anywhere in ``value`` (a parsed record), or None:
    nesting, string lengths and lone surrogates, array and object sizes, integers outside
    64 bits, numbers that are not finite.  Iterative: a hostile record cannot exhaust the
    stack."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        where, item = stack.pop()
        problem = _scalar_problem(item)
        if problem is None and isinstance(item, (dict, list)):
            if len(where) >= MAX_DEPTH:
                problem = f"nests arrays and objects more than {MAX_DEPTH} deep"
            elif len(item) > MAX_ITEMS:
                problem = f"has {len(item):,} members, over the limit of {MAX_ITEMS:,}"
            elif isinstance(item, dict):
                for key, member in item.items():
                    key_problem = _string_problem(key)
                    if key_problem:
                        return f"key {_where(where + (key[:40],))} {key_problem}"
                    stack.append((where + (key,), member))
            else:
                stack.extend((where + (n,), member) for n, member in enumerate(item))
        if problem:
            return f"key {_where(where)} {problem}" if where else problem
    return None


def _scalar_problem(item: Any) -> str | None:
    if isinstance(item, str):
        return _string_problem(item)
    if isinstance(item, bool) or item is None:
        return None
    if isinstance(item, int) and not INT64[0] <= item <= INT64[1]:
        return f"is {_show(item)}, outside the 64-bit integers a warehouse holds"
    if isinstance(item, float) and not math.isfinite(item):
        return f"is {_show(item)}: {_NOT_FINITE}"
    return None


def _string_problem(text: str) -> str | None:
    if len(text) > MAX_STRING_CHARS:
        return f"is a string of {len(text):,} characters, over the limit of {MAX_STRING_CHARS:,}"
    if _SURROGATE.search(text):
        return "holds a lone UTF-16 surrogate (\\ud800-\\udfff): not text"
    return None


def _where(path: tuple[Any, ...]) -> str:
    return repr(" -> ".join(str(p) for p in path))


def _show(value: Any) -> str:
    """A value as JSON spells it, cut to 60 characters."""
    if isinstance(value, _NonFinite):
        text = value.text
    elif isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**60:
        text = f"an integer of {len(str(abs(value))):,} digits"
    else:
        try:
            text = json.dumps(value)
        except (ValueError, RecursionError):
            text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _is_time(value: Any) -> bool:
    """An ISO 8601 time with a UTC offset."""
    if not isinstance(value, str) or len(value) > 64:
        return False
    try:
        return datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False


def _in_utc_range(value: str) -> bool:
    """Whether the time (``_is_time``) is still within Python's years 1 to 9999 in UTC."""
    try:
        datetime.fromisoformat(value).astimezone(timezone.utc)
    except OverflowError:
        return False
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_KIND_CHECKS = {
    "int": _is_int,
    "int64": _is_int,
    "num": _is_num,
    "metric": _is_num,
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "obj": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "time": _is_time,
}
_KIND_NAMES = {"int": "an integer", "int64": "an integer", "num": "a number",
               "metric": "a number", "str": "a string", "bool": "true or false",
               "obj": "an object", "list": "an array", "time": "an ISO 8601 time with a UTC offset"}
_INT_RANGES = {"int": INT32, "int64": INT64}


def _check_identity(directory: Path, spec: dict[str, Any], result: dict[str, Any]) -> RunKey:
    """spec.json, result.json and the directory must all name the same run."""
    for key in ("sweep", "cell_id", "repeat", "attempt", "env_id"):
        if spec[key] != result[key]:
            raise BadBundle(directory / RESULT, f"{key} is {_show(result[key])} but "
                                                f"spec.json says {_show(spec[key])}")
    if spec["repeat"] < 0 or spec["attempt"] < 1:
        raise BadBundle(directory / SPEC, f"repeat {spec['repeat']}, attempt {spec['attempt']}: "
                                          "repeats count from 0, attempts from 1")
    run = RunKey(spec["sweep"], spec["cell_id"], spec["repeat"], spec["attempt"])
    expected = run_dir_name(run.repeat, run.attempt)
    if directory.name != expected:
        raise BadBundle(directory, f"directory name does not match spec.json (repeat "
                                   f"{run.repeat}, attempt {run.attempt}: expected {expected!r})")
    if directory.parent.name != run.cell_id:
        raise BadBundle(directory, f"is not inside a folder named after its cell_id "
                                   f"{_show(run.cell_id)} (found {directory.parent.name!r})")
    return run


# -- JSON-lines files --------------------------------------------------------------------

#: A smaller block is read line by line: reading in bulk costs about as much as reading fifty
#: lines one at a time.
_BULK_MIN_BYTES = 4096

# JSON number texts the bulk reading takes, each converted by Arrow to the very value
# ``json.loads`` and then a warehouse column would hold: an integer of at most 10 digits for an
# INTEGER column (the cast checks its range) and of at most 18 for a BIGINT one (always within
# it); for a DOUBLE column a decimal fraction or exponent, or an integer of at most 15 digits
# (exact in a double) but -0 (an integer zero to Python, a negative zero to Arrow).
_INT32_TEXT = r"-?(?:0|[1-9][0-9]{0,9})"
_INT64_TEXT = r"-?(?:0|[1-9][0-9]{0,17})"
_DOUBLE_TEXT = (r"(?:0|-?[1-9][0-9]{0,14}"
                r"|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+))")
_TO_THE_END = 2**31 - 1  # a slice's stop past any line (Arrow's default stop is unreliable)
_TRIM = pc.TrimOptions('"}\r')  # around a value cut out of a line: a string's quotes, the line's end


class _Bulk:
    """The lines of one kind of record exactly as their writer formats them — ``json.dumps``
    of these keys in this order — read many at a time.

    ``fields``: (key, the JSON text of its value as a regular expression, the Arrow type of
    its column, or None for a key not kept); ``optional``: (key, text) of trailing keys a
    writer may add, not kept.  ``row_type``: the ``type`` of these records (None: every
    record but the header is one).
    """

    def __init__(self, row_type: str | None, fields: list[tuple[str, str, pa.DataType | None]],
                 optional: tuple[tuple[str, str], ...] = ()) -> None:
        self.row_type = row_type
        keys = ", ".join(f'"{key}": {text}' for key, text, _ in fields)
        tail = "".join(f'(?:, "{key}": {text})?' for key, text in optional)
        self.pattern = r"\A\{" + keys + tail + r"\}\r?\z"
        # (column, its piece of the line cut at ", ", the bytes before its value there, type);
        # the piece's index an Arrow scalar already (converting an int each call costs a failed
        # import in pyarrow)
        self.columns = [(key, pa.scalar(n, pa.int32()), len(f'"{key}": ') + (n == 0), kind)
                        for n, (key, _, kind) in enumerate(fields) if kind is not None]
        self.schema = pa.schema([(key, kind) for key, _, _, kind in self.columns])

    def is_row(self, number: int, record: dict[str, Any]) -> bool:
        """Whether a record read exactly is one of these (then it goes into the rows)."""
        return number > 1 and (self.row_type is None or record.get("type") == self.row_type)

    def read(self, lines: pa.Array) -> tuple[pa.Array, pa.RecordBatch] | None:
        """Which ``lines`` (binary) are written this way, and their columns; None when one of
        them holds a value its column cannot (an integer beyond it, a number beyond a double),
        which only the exact reading reports."""
        matched = pc.match_substring_regex(lines, self.pattern)
        pieces = pc.split_pattern(lines.filter(matched), b", ")
        arrays = []
        for _, piece, skip, kind in self.columns:
            text = pc.binary_slice(pc.list_element(pieces, piece), skip, _TO_THE_END)
            text = pc.ascii_trim(text.view(pa.string()), options=_TRIM)
            if pa.types.is_string(kind):
                arrays.append(text)
                continue
            try:
                values = pc.cast(text, kind)
            except pa.ArrowInvalid:
                return None
            if pa.types.is_floating(kind) and not pc.all(pc.is_finite(values)).as_py():
                return None
            arrays.append(values)
        return matched, pa.RecordBatch.from_arrays(arrays, schema=self.schema)


# Step records as the harness writes them (runner/harness/events.py), monitor samples as the
# host's monitors do (runner/executors/monitor.py, monitor_cgroup.py: the cgroup's usage too).
_STEP_LINES = _Bulk("step", [
    ("type", '"step"', None), ("epoch", _INT32_TEXT, pa.int32()), ("step", _INT32_TEXT, pa.int32()),
    ("phase", '"(?:warmup|timed)"', pa.string()), ("seconds", _DOUBLE_TEXT, pa.float64()),
    ("images", _INT32_TEXT, pa.int32())])
_SAMPLE_LINES = _Bulk(None, [
    ("t", _DOUBLE_TEXT, pa.float64()), ("cpu_user", _DOUBLE_TEXT, pa.float64()),
    ("cpu_system", _DOUBLE_TEXT, pa.float64()), ("iowait", _DOUBLE_TEXT, pa.float64()),
    ("rss_bytes", _INT64_TEXT, pa.int64()), ("nprocs", _INT32_TEXT, pa.int32())],
    optional=(("mem_usage_bytes", _INT64_TEXT),))
# GPU samples (runner/executors/energy.py): few (two a second per GPU) and with nulls where a GPU
# does not support a query, so always read exactly; the _Bulk gives their columns.
_GPU_LINES = _Bulk(None, [
    ("t", _DOUBLE_TEXT, pa.float64()), ("gpu", _INT32_TEXT, pa.int32()), ("util", "", pa.float64()),
    ("mem_util", "", pa.float64()), ("mem_used_bytes", "", pa.int64()), ("power_w", "", pa.float64()),
    ("energy_j", "", pa.float64()), ("sm_clock_mhz", "", pa.int32()), ("mem_clock_mhz", "", pa.int32()),
    ("temp_c", "", pa.float64()), ("throttle", "", pa.int64())])
#: The columns of ``Bundle.steps`` and ``Bundle.monitor_samples`` record batches.
STEP_COLUMNS = _STEP_LINES.schema
SAMPLE_COLUMNS = _SAMPLE_LINES.schema
GPU_COLUMNS = _GPU_LINES.schema

# Checks one record read exactly and keeps it: True when it is a row (``_Bulk.is_row``),
# which the reader keeps.
_Take = Callable[[int, dict[str, Any]], bool]


@dataclass
class _JsonLines:
    """One JSON-lines file of a bundle, read block by block (``read``).

    Each line is an object; line 1 is the header, of this ``schema_version``.  A final line
    that does not parse and has no newline was cut off mid-write: tolerated (and reported as
    a warning) for a run that did not finish ok, an error for one that did.  Every record
    is held to the bundle-wide limits (``_value_problem``).
    """

    path: Path
    finished_ok: bool
    warnings: list[str]
    bulk: _Bulk
    take: _Take
    exact_only: bool = False  # every line read exactly (``_Bulk`` then gives only the columns)

    def read(self, file: _File, digest: Any) -> Rows:
        """Every line, each record given to ``take``; return the rows."""
        rows: Rows = []
        for first, block, cut in _blocks(self.path, file, digest):
            lines = _split_lines(block)
            if first == 1:  # the header, read on its own
                self.exact(1, lines[:1], cut=cut and len(lines) == 1)
                lines, first = lines[1:], 2
            bulk = len(block) >= _BULK_MIN_BYTES and not self.exact_only
            batch = self.in_bulk(first, lines, cut=cut) if bulk else None
            if batch is None:
                records = self.exact(first, lines, cut=cut)
                if records:
                    rows.append(_rows_chunk(self.bulk.schema, records))
            elif batch.num_rows:
                rows.append(batch)
        return rows

    def exact(self, first: int, lines: list[bytes], *, cut: bool) -> list[dict[str, Any]]:
        """Read ``lines`` (line ``first`` on) one at a time; ``cut``: the last of them ends the
        file without a newline.  Return the rows among them."""
        rows = []
        for n, line in enumerate(lines):
            record = self.record(first + n, line, cut=cut and n == len(lines) - 1)
            if record is None:
                self.warnings.append(f"{self.path.name}: ignored truncated line {first + n}")
                break
            if self.take(first + n, record):
                rows.append(record)
        return rows

    def in_bulk(self, first: int, lines: list[bytes], *, cut: bool) -> pa.RecordBatch | None:
        """The rows among ``lines`` (line ``first`` on) read in bulk, the other lines exactly;
        None, with nothing of them taken, when they must be read one at a time (``exact``): a
        row the bulk reading cannot vouch for, or a line at fault, reported there in its place."""
        read = self.bulk.read(pa.array(lines, pa.binary()))
        if read is None:
            return None
        matched, batch = read
        others: list[tuple[int, dict[str, Any] | None]] = []
        for n in pc.indices_nonzero(pc.invert(matched)).to_pylist():
            try:
                record = self.record(first + n, lines[n], cut=cut and n == len(lines) - 1)
            except BadBundle:
                return None
            if record is not None and self.bulk.is_row(first + n, record):
                return None  # a row written otherwise: read exactly, it keeps its place among the rows
            others.append((first + n, record))
        for number, record in others:
            if record is None:
                self.warnings.append(f"{self.path.name}: ignored truncated line {number}")
                break
            self.take(number, record)
        return batch

    def record(self, number: int, line: bytes, *, cut: bool) -> dict[str, Any] | None:
        """Line ``number``'s object; None when it is the cut-off last line (``cut``) of a run
        that did not finish ok."""
        try:
            obj = loads(line)
        except _Refused as exc:
            raise BadBundle(self.path, f"line {number} {exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if cut:
                if self.finished_ok:
                    raise BadBundle(self.path, f"line {number} is truncated (the file ends "
                                               "mid-record) but result.json says status ok") from None
                return None
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise BadBundle(self.path, f"invalid JSON at line {number}: {reason}") from None
        if not isinstance(obj, dict):
            raise BadBundle(self.path, f"line {number} is not a JSON object")
        if number == 1:
            if obj.get("type") != "header":
                raise BadBundle(self.path, "line 1 is not a header record")
            _check_version(self.path, obj)
        return obj


def _split_lines(block: bytes) -> list[bytes]:
    """A block's lines, without their newlines."""
    lines = block.split(b"\n")
    if block.endswith(b"\n"):
        lines.pop()
    return lines


def _rows_chunk(schema: pa.Schema, records: list[dict[str, Any]]) -> pa.RecordBatch | list[dict[str, Any]]:
    """Rows read exactly, as a record batch of ``schema``; the records themselves when a value
    does not fit its Arrow column (``rows`` names it)."""
    try:
        return pa.RecordBatch.from_arrays(
            [pa.array([r.get(f.name) for r in records], type=f.type) for f in schema], schema=schema)
    except (pa.ArrowException, OverflowError, ValueError, TypeError):
        return records


def _check_line(path: Path, number: int, record: dict[str, Any], what: str,
                keys: _Spec | None) -> None:
    """A record's typed keys (``keys``), then the bundle-wide limits over all of it."""
    problem = _check_record(record, keys) if keys else None
    problem = problem or _value_problem(record)
    if problem:
        raise BadBundle(path, f"line {number}: {what} {problem}")


def _read_events(bundle: Bundle, path: Path, file: _File | None, digest: Any, *,
                 finished_ok: bool) -> None:
    digest.update(_frame(EVENTS, file.size if file else 0))
    if file is None or not file.size:
        if finished_ok:
            raise BadBundle(path, "is missing or empty, but result.json says status ok")
        return
    checks = {"step": _STEP_KEYS, "epoch": _EPOCH_KEYS, "summary": _SUMMARY_KEYS, "layer": _LAYER_KEYS,
              "probe": _PROBE_KEYS, "phases": _PHASE_KEYS}

    def take(number: int, record: dict[str, Any]) -> bool:
        kind = record.get("type")
        what = f"{kind} record" if isinstance(kind, str) and kind.isidentifier() else "record"
        _check_line(path, number, record, what, checks.get(kind) if isinstance(kind, str) else None)
        if number == 1:
            bundle.header = record
        elif kind == "step":
            if record["phase"] not in _PHASES:
                raise BadBundle(path, f"line {number}: step phase {record['phase']!r} is not "
                                      "'warmup', 'timed' or 'sampled'")
            return True
        elif kind == "phases":
            bundle.phases.extend(_phase_rows(path, number, record))
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
        return False

    lines = _JsonLines(path, finished_ok, bundle.warnings, _STEP_LINES, take)
    bundle.steps = lines.read(file, digest)


def _phase_rows(path: Path, number: int, record: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``phases`` record's rows: each phase name (a phase of ``phases.PHASES`` or several
    joined by ``+``) with its seconds, a finite number >= 0, in the record's order."""
    rows = []
    for ordinal, (name, seconds) in enumerate(record["phases"].items()):
        if not phase_known(name):
            raise BadBundle(path, f"line {number}: phases record names {_show(name)}, not a phase "
                                  f"({', '.join(PHASE_NAMES)}, or several joined by '+')")
        if not _is_num(seconds) or not math.isfinite(seconds) or seconds < 0:
            raise BadBundle(path, f"line {number}: phases record's {name!r} should be a finite "
                                  f"number of seconds >= 0, got {_show(seconds)}")
        rows.append({"step": record["step"], "ordinal": ordinal, "phase": name, "seconds": float(seconds),
                     "step_seconds": float(record["seconds"])})
    return rows


def _read_monitor(bundle: Bundle, path: Path, file: _File | None, digest: Any, *,
                  finished_ok: bool) -> None:
    digest.update(_frame(MONITOR, file.size if file else 0))
    if file is None or not file.size:  # a run can end before the monitor's first write; aggregates live in result
        return
    bundle.monitor_header, bundle.monitor_samples = _read_samples(
        bundle, path, file, digest, finished_ok=finished_ok, keys=_SAMPLE_KEYS, bulk=_SAMPLE_LINES)


def _read_gpu(bundle: Bundle, path: Path, file: _File | None, digest: Any, *, finished_ok: bool) -> None:
    """gpu.jsonl, when there is one: it enters the digest only then (``OPTIONAL_FILES``)."""
    if file is None:
        return
    digest.update(_frame(GPU, file.size))
    if file.size:
        bundle.gpu_header, bundle.gpu_samples = _read_samples(
            bundle, path, file, digest, finished_ok=finished_ok, keys=_GPU_KEYS, bulk=_GPU_LINES, exact_only=True)


def _read_samples(bundle: Bundle, path: Path, file: _File, digest: Any, *, finished_ok: bool, keys: _Spec,
                  bulk: _Bulk, exact_only: bool = False) -> tuple[dict[str, Any], Rows]:
    """A samples file (monitor.jsonl, gpu.jsonl): its header and its samples, each checked
    against ``keys``."""
    header: dict[str, Any] = {}

    def take(number: int, record: dict[str, Any]) -> bool:
        if number == 1:
            _check_line(path, number, record, "header", None)
            header.update(record)
            return False
        _check_line(path, number, record, "sample", keys)
        return True

    rows = _JsonLines(path, finished_ok, bundle.warnings, bulk, take, exact_only=exact_only).read(file, digest)
    return header, rows
