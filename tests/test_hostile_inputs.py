"""Hostile bundles and hostile matrices (issue 11): each is refused with one sentence naming
the file and the key, never a traceback, and one bad bundle never keeps a good one out.

Bundles come from bundle_factory (events.jsonl of a default bundle: line 1 header, 2 probe,
3 data, 4 model, 5-10 six steps, 11-12 two epochs, 13 summary, 14 end; monitor.jsonl: 1
header, 2-3 samples) and are then damaged as a broken or hostile writer would, with JSON text
``json.dumps`` never writes (``1e400``, a 5000-digit integer, a lone surrogate).  Matrices are
files loaded as ``matrun plan`` loads them and, for the issue's own cases, given to ``matrun
plan`` as a real subprocess.
"""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from bundle_factory import make_bundle
from matrun.errors import MatrixError
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.planning.params import PARAMS
from matrun.warehouse.bundles.read import BadBundle, load_bundle, loads
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.ingest import ingest

MATRUN = [sys.executable, "-m", "matrun.runner.cli.main"]
GOOD = "900d000000000001"
INT32 = "(-2,147,483,648 to 2,147,483,647)"
INT64 = "(-9,223,372,036,854,775,808 to 9,223,372,036,854,775,807)"
FINITE = 'it must be a finite number (docs/BUNDLE.md "Validation")'
_MARK = "@@HOSTILE@@"


def run_matrun(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MATRUN, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)


def put_raw(path: Path, keys: tuple[Any, ...], raw: str, line: int | None = None) -> None:
    """Set the value at ``keys`` of a bundle file (of line ``line`` of a JSON-lines file) to
    the JSON text ``raw``, verbatim; missing objects on the way are created."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines() if line else [text]
    index = (line or 1) - 1
    record = json.loads(lines[index])
    target = record
    for key in keys[:-1]:
        target = target[key] if isinstance(target, list) else target.setdefault(key, {})
    target[keys[-1]] = _MARK
    lines[index] = json.dumps(record).replace(json.dumps(_MARK), raw)
    path.write_text("\n".join(lines) + ("\n" if line else ""), encoding="utf-8")


def move_run(directory: Path, repeat: str, attempt: str) -> Path:
    """Give spec.json and result.json another repeat / attempt (as JSON text) and move the
    run directory to match, as a writer that believed them would have."""
    for name in ("spec.json", "result.json"):
        put_raw(directory / name, ("repeat",), repeat)
        put_raw(directory / name, ("attempt",), attempt)
    return directory.rename(directory.with_name(f"{repeat}-{attempt}"))


def raw(file: str, keys: tuple[Any, ...], text: str, line: int | None = None) -> Callable[[Path], None]:
    return lambda d: put_raw(d / file, keys, text, line)


# name: (how to damage a default bundle (returns the new directory if it moved), the reason
# ingest gives; a reason ending in "…" is a prefix)
HOSTILE_BUNDLES: dict[str, tuple[Callable[[Path], Path | None], str]] = {
    # the three tracebacks
    "exit_code 10^30": (
        raw("result.json", ("exit_code",), "1" + "0" * 30),
        f"result.json: key 'exit_code' is 1000000000000000000000000000000, outside the range of its "
        f"warehouse column {INT32}"),
    "repeat 3e9": (
        lambda d: move_run(d, "3000000000", "1"),
        f"spec.json: key 'repeat' is 3000000000, outside the range of its warehouse column {INT32}"),
    "spec.json nested 100,000 deep": (
        raw("spec.json", ("params", "extra"), "[" * 100_000 + "]" * 100_000),
        "spec.json: nests arrays and objects more than 64 deep (at column …"),
    # nesting
    "events line nested 100,000 deep": (
        raw("events.jsonl", ("extra",), "{\"a\": " * 100_000 + "1" + "}" * 100_000, line=2),
        "events.jsonl: line 2 nests arrays and objects more than 64 deep (at column …"),
    "monitor header nested one level too deep": (
        raw("monitor.jsonl", ("extra",), "[" * 64 + "]" * 64, line=1),  # the record is level 1
        "monitor.jsonl: line 1 nests arrays and objects more than 64 deep (at column …"),
    # numbers that are not finite where no meaning is documented
    "throughput Infinity": (
        raw("events.jsonl", ("throughput",), "Infinity", line=13),
        f"events.jsonl: line 13: summary record key 'throughput' is Infinity: {FINITE}"),
    "throughput 1e400": (
        raw("events.jsonl", ("throughput",), "1e400", line=13),
        f"events.jsonl: line 13: summary record key 'throughput' is 1e400: {FINITE}"),
    "throughput NaN": (
        raw("events.jsonl", ("throughput",), "NaN", line=13),
        f"events.jsonl: line 13: summary record key 'throughput' is NaN: {FINITE}"),
    "step seconds -Infinity": (
        raw("events.jsonl", ("seconds",), "-Infinity", line=5),
        f"events.jsonl: line 5: step record key 'seconds' is -Infinity: {FINITE}"),
    "wall_seconds 1e400": (
        raw("result.json", ("wall_seconds",), "1e400"),
        f"result.json: key 'wall_seconds' is 1e400: {FINITE}"),
    "monitor average NaN": (
        raw("result.json", ("monitor", "cpu_user_avg"), "NaN"),
        f"result.json: key 'monitor -> cpu_user_avg' is NaN: {FINITE}"),
    "a number of the host 1e999": (
        raw("result.json", ("host", "sensors", "temp"), "1e999"),
        f"result.json: key 'host -> sensors -> temp' is 1e999: {FINITE}"),
    "model parameters Infinity": (
        raw("events.jsonl", ("parameters",), "Infinity", line=4),
        f"events.jsonl: line 4: model record key 'parameters' is Infinity: {FINITE}"),
    # integers beyond their column
    "step images 2^31": (
        raw("events.jsonl", ("images",), str(2**31), line=5),
        f"events.jsonl: line 5: step record key 'images' is 2147483648, outside the range of its "
        f"warehouse column {INT32}"),
    "epoch steps below INTEGER": (
        raw("events.jsonl", ("steps",), str(-(2**31) - 1), line=11),
        f"events.jsonl: line 11: epoch record key 'steps' is -2147483649, outside the range of its "
        f"warehouse column {INT32}"),
    "summary timed_steps 2^31": (
        raw("events.jsonl", ("timed_steps",), str(2**31), line=13),
        f"events.jsonl: line 13: summary record key 'timed_steps' is 2147483648, outside the range of "
        f"its warehouse column {INT32}"),
    "sample rss_bytes 2^64": (
        raw("monitor.jsonl", ("rss_bytes",), str(2**64), line=2),
        f"monitor.jsonl: line 2: sample key 'rss_bytes' is 18446744073709551616, outside the range of "
        f"its warehouse column {INT64}"),
    "monitor samples 2^40": (
        raw("result.json", ("monitor", "samples"), str(2**40)),
        f"result.json: key 'monitor -> samples' is 1099511627776, outside the range of its warehouse "
        f"column {INT32}"),
    "monitor rss_peak_bytes Infinity": (
        raw("result.json", ("monitor", "rss_peak_bytes"), "Infinity"),
        "result.json: key 'monitor -> rss_peak_bytes' should be an integer, got Infinity"),
    "parameter batch_size 2^40": (
        raw("spec.json", ("params", "batch_size"), str(2**40)),
        f"spec.json: key 'params -> batch_size' is 1099511627776, outside the range of its warehouse "
        f"column {INT32}"),
    "parameter batch_size as text": (
        raw("spec.json", ("params", "batch_size"), '"64"'),
        "spec.json: key 'params -> batch_size' should be an integer, got \"64\""),
    "a parameter 2^64 (a JSON column)": (
        raw("spec.json", ("params", "train_limit"), str(2**64)),
        "spec.json: key 'params -> train_limit' is 18446744073709551616, outside the 64-bit "
        "integers a warehouse holds"),
    "an integer of 5000 digits": (
        raw("result.json", ("host", "cpu_count"), "9" * 5000),
        "result.json: has an integer of more digits than Python reads (4300)"),
    "repeat -1": (
        lambda d: move_run(d, "-1", "1"),
        "spec.json: repeat -1, attempt 1: repeats count from 0, attempts from 1"),
    "attempt 0": (
        lambda d: move_run(d, "0", "0"),
        "spec.json: repeat 0, attempt 0: repeats count from 0, attempts from 1"),
    # sizes
    "error_tail of 2 MiB": (
        raw("result.json", ("error_tail",), json.dumps("x" * 2**21)),
        "result.json: key 'error_tail' is a string of 2,097,152 characters, over the limit of 1,048,576"),
    "a key of 2 MiB": (
        raw("result.json", ("host", "k" * 2**21), "1"),
        "result.json: key 'host -> " + "k" * 40 + "' is a string of 2,097,152 characters, over the limit "
        "of 1,048,576"),
    "libraries of 2^20 + 1 members": (
        raw("events.jsonl", ("libraries",), "[" + ",".join(["0"] * (2**20 + 1)) + "]", line=2),
        "events.jsonl: line 2: probe record key 'libraries' has 1,048,577 members, over the limit "
        "of 1,048,576"),
    "spec.json of 17 MiB": (
        raw("spec.json", ("pad",), json.dumps("x" * 17 * 2**20)),
        "spec.json: is 17.0 MiB, over the 16.0 MiB limit for a bundle file"),
    # text and times
    "a lone surrogate": (
        raw("result.json", ("host", "hostname"), '"\\ud800"'),
        "result.json: key 'host -> hostname' holds a lone UTF-16 surrogate (\\ud800-\\udfff): not text"),
    "a lone surrogate as a key": (
        raw("result.json", ("host",), '{"\\udfff": 1}'),
        "result.json: key 'host -> \\udfff' holds a lone UTF-16 surrogate (\\ud800-\\udfff): not text"),
    "started_at before year 1 in UTC": (
        raw("result.json", ("started_at",), '"0001-01-01T00:00:00+14:00"'),
        "result.json: key 'started_at' is \"0001-01-01T00:00:00+14:00\", outside the years 1 to 9999 "
        "in UTC (a warehouse time)"),
    "ended_at after year 9999 in UTC": (
        raw("result.json", ("ended_at",), '"9999-12-31T23:59:59-14:00"'),
        "result.json: key 'ended_at' is \"9999-12-31T23:59:59-14:00\", outside the years 1 to 9999 "
        "in UTC (a warehouse time)"),
    # types a view relies on
    "probe libraries not a list": (
        raw("events.jsonl", ("libraries",), '"libgomp"', line=2),
        "events.jsonl: line 2: probe record key 'libraries' should be an array, got \"libgomp\""),
}


def matches(actual: str, expected: str) -> bool:
    return actual.startswith(expected[:-1]) if expected.endswith("…") else actual == expected


def hostile_bundle(results: Path, case: str, cell_id: str = "c0ffee0000000001") -> Path:
    directory = make_bundle(results, cell_id=cell_id)
    moved = HOSTILE_BUNDLES[case][0](directory)
    return moved or directory


@pytest.mark.parametrize("case", sorted(HOSTILE_BUNDLES))
def test_each_hostile_bundle_is_refused_naming_the_file_and_key(tmp_path: Path, case: str) -> None:
    directory = hostile_bundle(tmp_path / "results", case)
    with pytest.raises(BadBundle) as err:
        load_bundle(directory)
    assert matches(err.value.short(), HOSTILE_BUNDLES[case][1]), err.value.short()


@pytest.mark.parametrize("case", ["exit_code 10^30", "repeat 3e9", "spec.json nested 100,000 deep",
                                  "throughput Infinity"])
def test_the_good_bundle_beside_a_hostile_one_is_ingested(tmp_path: Path, case: str) -> None:
    """The issue's cases: the hostile bundle stopped the whole ingest; now it alone is skipped."""
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    good = make_bundle(results, cell_id=GOOD)
    bad = hostile_bundle(results, case)
    report = ingest([results], warehouse=wh)
    assert [(path, matches(reason, HOSTILE_BUNDLES[case][1])) for path, reason in report.skipped] == [
        (bad.resolve(), True)]
    assert report.ingested == [good.resolve()]
    with open_warehouse(wh, read_only=True) as w:
        assert w.con.execute("SELECT run_id FROM runs").fetchall() == [(f"{GOOD}/0-1",)]


def test_loads_never_recurses_into_hostile_text() -> None:
    """``read.loads``, the parsing under load_bundle, public for the other readers of a results
    directory: a ValueError, never a RecursionError, for text json.loads would recurse into."""
    for text, problem in [(b"[" * 100_000 + b"]" * 100_000, "more than 64 deep (at column 65)"),
                          (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, "more than 64 deep"),
                          (b"[\n" * 65 + b"]" * 65, "more than 64 deep (at line 65, column 1)"),
                          (b"9" * 5000, "more digits than Python reads")]:
        with pytest.raises(ValueError, match=re.escape(problem)):
            loads(text)
    deepest: list[Any] = []
    for _ in range(63):
        deepest = [deepest]
    assert loads(b"[" * 64 + b"]" * 64) == deepest  # 64 deep is read
    # brackets inside strings (an escaped quote included) are text, not nesting
    assert loads(b'{"s": "' + b"[{" * 100_000 + b'\\"", "t": 1}') == {"s": "[{" * 100_000 + '"', "t": 1}
    with pytest.raises(json.JSONDecodeError):  # a string that never ends: bad syntax, nothing more
        loads(b'"unterminated ' + b"[" * 100)


# Damage a reader takes: each of these bundles is ingested.
def _diverged(d: Path) -> None:
    put_raw(d / "events.jsonl", ("train_loss",), "NaN", line=11)
    put_raw(d / "events.jsonl", ("test_loss",), "Infinity", line=12)
    put_raw(d / "events.jsonl", ("test_accuracy",), "NaN", line=12)
    put_raw(d / "events.jsonl", ("accuracy",), "NaN", line=13)
    put_raw(d / "events.jsonl", ("diverged",), "true", line=13)


def _at_the_limits(d: Path) -> None:
    put_raw(d / "result.json", ("exit_code",), str(2**31 - 1))
    put_raw(d / "monitor.jsonl", ("rss_bytes",), str(2**63 - 1), line=2)


ACCEPTED: dict[str, Callable[[Path], None]] = {
    "diverged: NaN and Infinity losses and accuracies": _diverged,
    "brackets inside a string are text": raw("events.jsonl", ("note",), json.dumps("[{" * 50_000), line=2),
    "nested exactly 64 deep": raw("events.jsonl", ("extra",), "[" * 63 + "]" * 63, line=2),
    "integers at their columns' limits": _at_the_limits,
}


def test_a_diverged_runs_non_finite_losses_are_read_as_null(tmp_path: Path) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    directory = make_bundle(results)
    _diverged(directory)
    bundle = load_bundle(directory)
    assert [(e["train_loss"], e["test_loss"], e["test_accuracy"]) for e in bundle.epochs] == [
        (None, 0.8, 0.7), (0.5, None, None)]
    assert bundle.summary is not None and bundle.summary["accuracy"] is None
    assert ingest([results], warehouse=wh).skipped == []
    with open_warehouse(wh, read_only=True) as w:
        assert w.con.execute("SELECT accuracy, diverged FROM runs").fetchall() == [(None, True)]
        assert w.con.execute("SELECT train_loss, test_loss, test_accuracy FROM epochs ORDER BY epoch"
                             ).fetchall() == [(None, 0.8, 0.7), (0.5, None, None)]


def test_matrun_ingest_skips_every_hostile_bundle_and_loads_the_rest(tmp_path: Path) -> None:
    """All the hostile bundles and the accepted damage in one results directory, beside a good
    bundle, through `matrun ingest` (a real subprocess): a reason for each hostile one, no
    traceback, a non-zero exit, and every other bundle in the warehouse with no NaN in it."""
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    make_bundle(results, cell_id=GOOD)
    expected: dict[str, str] = {}
    for n, case in enumerate(sorted(HOSTILE_BUNDLES)):
        directory = hostile_bundle(results, case, cell_id=f"bad{n:013d}")
        expected[str(directory.resolve())] = HOSTILE_BUNDLES[case][1]
    accepted = [f"ace{n:013d}" for n in range(len(ACCEPTED))]
    for cell_id, damage in zip(accepted, ACCEPTED.values()):
        damage(make_bundle(results, cell_id=cell_id))

    res = run_matrun("ingest", results, "--warehouse", wh, cwd=tmp_path)
    assert "Traceback" not in res.stderr
    assert res.returncode != 0  # bundles were skipped
    skipped = dict(re.findall(r"^skipped (\S+): (.*)$", res.stderr, flags=re.M))
    assert sorted(skipped) == sorted(expected)
    for path, reason in skipped.items():
        assert matches(reason, expected[path]), (path, reason)
    assert f"ingested {1 + len(ACCEPTED)} run(s)" in res.stdout + res.stderr
    with open_warehouse(wh, read_only=True) as w:
        assert sorted(r[0] for r in w.con.execute("SELECT cell_id FROM runs").fetchall()) == sorted(
            [*accepted, GOOD])
        for table in ("runs", "steps", "epochs", "monitor_samples", "layers"):
            w.con.execute(f"SELECT * FROM {table}").fetchall()  # every value converts back
        doubles = [c for (c,) in w.con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'runs' AND data_type = 'DOUBLE'"
        ).fetchall()]
        assert w.con.execute("SELECT count(*) FROM runs WHERE " + " OR ".join(
            f"isnan({c}) OR isinf({c})" for c in doubles)).fetchone() == (0,)
        assert w.con.execute("SELECT max(rss_bytes) FROM monitor_samples").fetchone() == (2**63 - 1,)


# Values a damaged writer could leave anywhere, as JSON text.
DAMAGE = ["1" + "0" * 30, str(-(2**63) - 1), str(2**31), str(2**63), "NaN", "Infinity", "-Infinity",
          "1e400", "9" * 5000, '"\\ud800"', "null", "true", '"text"', "[]", "{}", "[[[[]]]]",
          "[" * 70 + "]" * 70, "-1", "0", "1.5", '"9999-12-31T23:59:59-14:00"']


def _leaves(value: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, where + (k,))] + ([where] if where else [])
    if isinstance(value, list) and value:
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, where + (i,))] + [where]
    return [where]


def test_random_damage_anywhere_is_refused_or_ingested_never_a_traceback(tmp_path: Path) -> None:
    """120 bundles, each with one value anywhere (spec, result, events, monitor) replaced by one
    of DAMAGE, chosen with a fixed seed: reading each raises BadBundle or succeeds, and one ingest
    of them all beside a good bundle loads the good one and every bundle that was read, whose
    values then convert back from every table."""
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    template = make_bundle(tmp_path / "template")
    targets: list[tuple[str, int | None, tuple[Any, ...]]] = []
    for name in ("spec.json", "result.json", "events.jsonl", "monitor.jsonl"):
        text = (template / name).read_text(encoding="utf-8")
        numbered = [(None, text)] if name.endswith(".json") else list(enumerate(text.splitlines(), start=1))
        for line, content in numbered:
            targets += [(name, line, leaf) for leaf in _leaves(json.loads(content)) if leaf]
    rng = random.Random(11)
    make_bundle(results, cell_id=GOOD)
    read_ok: list[str] = []
    for n in range(120):
        name, line, leaf = rng.choice(targets)
        directory = make_bundle(results, cell_id=f"fuzz{n:012d}")
        put_raw(directory / name, leaf, rng.choice(DAMAGE), line)
        try:
            load_bundle(directory)
        except BadBundle:
            continue
        read_ok.append(f"fuzz{n:012d}")
    report = ingest([results], warehouse=wh)
    assert len(report.skipped) == 120 - len(read_ok) and read_ok
    with open_warehouse(wh, read_only=True) as w:
        assert sorted(r[0] for r in w.con.execute("SELECT cell_id FROM runs").fetchall()) == sorted(
            [*read_ok, GOOD])
        for table in ("runs", "steps", "epochs", "monitor_samples", "layers"):
            w.con.execute(f"SELECT * FROM {table}").fetchall()


# -- matrices ------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(text, encoding="utf-8")
    return path


HOSTILE_MATRICES = [
    # paths (issue: OSError: File name too long)
    ("300-character warehouse file name", f'[sweep]\nwarehouse = "{"a" * 300}.duckdb"\n',
     'matrix.toml: [sweep -> warehouse] has a file name of 307 bytes ("aaaa'),
    ("5 MB results path", '[sweep]\nresults = "' + "a/" * 2_500_000 + '"\n',
     "matrix.toml: [sweep -> results] is a path of 5,000,"),
    ("NUL in the results path", '[sweep]\nresults = "res\\u0000ults"\n',
     'matrix.toml: [sweep -> results] expected a path without control characters, got "res\\x00ults"'),
    ("newline in the data_dir", '[sweep]\ndata_dir = "data\\n"\n',
     'matrix.toml: [sweep -> data_dir] expected a path without control characters, got "data\\n"'),
    ("a 256-byte name in data_dir", f'[sweep]\ndata_dir = "/x/{"é" * 128}"\n',
     "matrix.toml: [sweep -> data_dir] has a file name of 256 bytes"),
    ("a user who does not exist", '[sweep]\nresults = "~no-such-user-matrun/r"\n',
     'matrix.toml: [sweep -> results] cannot expand "~no-such-user-matrun": no such user\'s home directory'),
    ("a long [slurm] python", f'[slurm]\npython = "/{"é" * 128}/python"\n',
     "matrix.toml: [slurm -> python] has a file name of 256 bytes"),
    # patterns anchored at the true end
    ("sweep name with a trailing newline", '[sweep]\nname = "demo\\n"\n',
     "matrix.toml: [sweep -> name] expected a name of letters, digits, '.', '_' or '-' (at most 64, "
     "not starting with '.' or '-'), got \"demo\\n\""),
    ("variant with a trailing newline", '[fixed]\nvariant = "cpu\\n"\n',
     "matrix.toml: [fixed -> variant] expected a variant name of lower-case letters, digits, '.', '_' "
     "or '-', got \"cpu\\n\""),
    ("cpuset with a trailing newline", '[fixed]\ncpuset = "0-1\\n"\n',
     'matrix.toml: [fixed -> cpuset] expected a CPU list such as "0-3,6" (or "" for no pinning), got "0-1\\n"'),
    ("partition with a trailing newline", '[slurm]\npartition = "debug\\n"\n',
     "matrix.toml: [slurm -> partition] expected a partition name of letters, digits"),
    ("valueless sbatch flag with a trailing newline", '[slurm]\nsbatch_args = ["--contiguous\\n"]\n',
     'matrix.toml: [slurm -> sbatch_args] expected the long form --name=value, e.g. "--constraint=avx512", '
     'got "--contiguous\\n"'),
    ("sbatch value with a trailing newline", '[slurm]\nsbatch_args = ["--comment=a\\n"]\n',
     'matrix.toml: [slurm -> sbatch_args] --comment needs a value of 1 to 256 printable characters, '
     'got "--comment=a\\n"'),
    ("slurm python with a trailing newline", '[slurm]\npython = "/usr/bin/python3\\n"\n',
     "matrix.toml: [slurm -> python] expected the absolute path of a Python interpreter"),
    # sizes that used to exhaust memory
    ("a cpuset of 10^14 CPUs", '[fixed]\ncpuset = "0-99999999999999"\n',
     'matrix.toml: [fixed -> cpuset] expected a CPU list such as "0-3,6"'),
    ("two billion cells", "[axes]\nseed = [" + ",".join(map(str, range(2000))) + "]\nbatch_size = ["
     + ",".join(map(str, range(1, 1001))) + "]\nwarmup_steps = [" + ",".join(map(str, range(1000))) + "]\n",
     "matrix.toml: [axes] the matrix expands to 2,000,000,000 cells, over the limit of 10,000; narrow the "
     "axes or raise [sweep] max_cells (at most 100,000; cells are counted before [[exclude]])"),
    ("max_cells two billion", "[sweep]\nmax_cells = 2000000000\n",
     "matrix.toml: [sweep -> max_cells] expected a positive integer at most 100,000, got 2000000000"),
    ("includes counted with the product", "[sweep]\nmax_cells = 3\n[axes]\nseed = [1, 2]\n"
     + "[[include]]\nseed = 7\n" * 2,
     "matrix.toml: [axes] the matrix expands to 4 cells, over the limit of 3;"),
    ("an axis of 100,001 values", "[axes]\nseed = [" + ",".join(map(str, range(100_001))) + "]\n",
     "matrix.toml: [axes -> seed] has 100,001 values; a matrix has at most 100,000 cells"),
    ("1,001 exclude tables", "[axes]\nseed = [1, 2]\n" + "[[exclude]]\nseed = 1\n" * 1001,
     "matrix.toml: [exclude] has 1,001 [[exclude]] tables; at most 1,000"),
    ("a matrix of 17 MiB", "# " + "x" * 17 * 2**20 + "\n",
     "matrix.toml: is 17.0 MiB, over the 16 MiB limit of a matrix file"),
    # nesting (tomllib recurses)
    ("arrays nested 100,000 deep", "[axes]\nthreads = " + "[" * 100_000 + "]" * 100_000 + "\n",
     "matrix.toml: invalid TOML: arrays or inline tables nested more than 8 deep"),
    ("inline tables nested 100,000 deep", "[fixed]\nthreads = " + "{a = " * 100_000 + "1" + "}" * 100_000 + "\n",
     "matrix.toml: invalid TOML: arrays or inline tables nested more than 8 deep"),
    ("arrays nested 20 deep", "[axes]\nthreads = " + "[" * 20 + "]" * 20 + "\n",
     "matrix.toml: [axes -> threads -> 0 -> 0 -> 0 -> 0 -> 0 -> 0 -> 0] nests tables and arrays more than 8 deep"),
    # numbers
    ("2^64 epochs", "[fixed]\nepochs = 18446744073709551616\n",
     "matrix.toml: [fixed -> epochs] expected a positive integer at most 100,000, got 18446744073709551616"),
    ("train_limit beyond 32 bits", "[fixed]\ntrain_limit = 2147483648\n",
     "matrix.toml: [fixed -> train_limit] expected a non-negative integer at most 2,147,483,647, got 2147483648"),
    ("timeout of 1e300 seconds", "[sweep]\ntimeout = 1e300\n",
     "matrix.toml: [sweep -> timeout] expected a positive number of seconds, at most 2,592,000 (30 days), "
     "got 1e+300"),
    ("timeout 1e400 (inf) in an include", "[[include]]\ntimeout = 1e400\n",
     "matrix.toml: [include -> 0 -> timeout] expected a positive number of seconds, got inf"),
    # keys
    ("dotted key", "[fixed]\na.b.c = 1\n", "matrix.toml: [fixed -> a] unknown parameter; known: "),
    ("a key with a NUL and a newline", '[fixed]\n"a\\u0000b\\n" = 1\n',
     "matrix.toml: [fixed -> a\\x00b\\n] unknown parameter; known: "),
    ("a key of 100,000 characters", '[axes]\n"' + "k" * 100_000 + '" = [1]\n',
     "matrix.toml: [axes -> " + "k" * 57 + "...] unknown parameter; known: "),
    ("unicode", '[fixed]\nmodel = "lénet5 ☃"\n',
     'matrix.toml: [fixed -> model] expected one of "lenet5", "cifar_cnn", "alexnet", "resnet18", '
     '"resnet50", "gpt-tiny", "gpt2-small", "vit-tiny", "vit-b16", got "lénet5 ☃"'),
    ("an escape sequence for the terminal", '[sweep]\nname = "\\u001b[31mred"\n',
     "matrix.toml: [sweep -> name] expected a name of letters, digits, '.', '_' or '-' (at most 64, "
     "not starting with '.' or '-'), got \"\\x1b[31mred\""),
]


@pytest.mark.parametrize("name, text, message", HOSTILE_MATRICES, ids=[m[0] for m in HOSTILE_MATRICES])
def test_hostile_matrix_is_refused_naming_the_key(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, text))
    assert str(err.value).startswith(message), str(err.value)[:300]
    assert err.value.exit_code == 2


@pytest.mark.parametrize("name", ["300-character warehouse file name", "5 MB results path",
                                  "sweep name with a trailing newline", "two billion cells",
                                  "arrays nested 100,000 deep"])
def test_matrun_plan_says_error_and_exits_2(tmp_path: Path, name: str) -> None:
    """The issue's matrices through `matrun plan`, a real subprocess: one `Error:` line that
    names the key, exit 2, no traceback."""
    text, message = next((t, m) for n, t, m in HOSTILE_MATRICES if n == name)
    write(tmp_path, text)
    res = run_matrun("plan", "matrix.toml", cwd=tmp_path)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr.startswith(f"Error: {message}") and "Traceback" not in res.stderr
    assert len(res.stderr.splitlines()) == 1


_MEASURE = """
import json, resource, sys, time
from pathlib import Path
from matrun.errors import MatrixError
from matrun.runner.planning.matrix import load_matrix
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.monotonic()
try:
    cells, message = len(load_matrix(Path(sys.argv[1])).cells), None
except MatrixError as exc:
    cells, message = None, str(exc)
seconds = time.monotonic() - start
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(json.dumps({"cells": cells, "message": message, "seconds": seconds, "grown": grown}))
"""


def measure_load(path: Path) -> dict[str, Any]:
    """load_matrix in a fresh interpreter: its cells or error, its time, its peak memory growth."""
    res = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("max_cells, key", [(None, "[axes] the matrix expands to 2,000,000,000 cells"),
                                            (2_000_000_000, "[sweep -> max_cells]")])
def test_a_two_billion_cell_product_is_refused_at_once_with_memory_flat(tmp_path: Path, max_cells, key) -> None:
    """The issue: with max_cells raised to 2·10^9 the product was expanded (1.4 GB after 8 s).
    Now it is counted first: refused within a second, memory flat, the key named."""
    sweep = f"[sweep]\nmax_cells = {max_cells}\n" if max_cells else ""
    path = write(tmp_path, sweep + "[axes]\nseed = [" + ",".join(map(str, range(2000))) + "]\nbatch_size = ["
                 + ",".join(map(str, range(1, 1001))) + "]\nwarmup_steps = [" + ",".join(map(str, range(1000))) + "]\n")
    result = measure_load(path)
    # Refused before the product is expanded: memory stays flat (its time is a measurement, not
    # checked here: a loaded CI host must not fail it).
    assert result["cells"] is None and result["message"].startswith(f"matrix.toml: {key}")
    assert result["grown"] < 200 * 2**20


@pytest.mark.slow
def test_the_largest_allowed_matrix_is_planned_in_bounded_memory(tmp_path: Path) -> None:
    """The ceiling of max_cells, 100,000 combinations (counted before excludes), of which an
    [[exclude]] drops half as the product is walked: 50,000 cells, in bounded memory."""
    path = write(tmp_path, "[sweep]\nmax_cells = 100000\n[fixed]\ndataset = \"synthetic\"\n[axes]\nseed = ["
                 + ",".join(map(str, range(10_000))) + "]\nbatch_size = [" + ",".join(map(str, range(1, 11)))
                 + "]\n[[exclude]]\nbatch_size = [1, 2, 3, 4, 5]\n")
    result = measure_load(path)
    assert result["cells"] == 50_000
    assert result["grown"] < 400 * 2**20


def test_non_finite_floats_and_huge_integers_in_every_key_are_refused(tmp_path: Path) -> None:
    """TOML's nan, inf and -inf, 1e400, integers of 2^64 and -2^64, a NUL, a newline, a deep array
    and a 1 MB string, in every parameter ([fixed]) and every [sweep] and [slurm] key: each an
    error naming that key, never a traceback; but 2^64 as a learning rate or a weight decay,
    which have no upper bound: a finite number, absurd but allowed."""
    values = ["nan", "inf", "-inf", "1e400", "18446744073709551616", "-18446744073709551616",
              '"a\\u0000b"', '"x\\n"', "[[[[[[[[1]]]]]]]]", '"' + "z" * 2**20 + '"']
    sections = {"fixed": list(PARAMS),
                "sweep": ["name", "results", "warehouse", "data_dir", "repeats", "timeout", "executor", "max_cells"],
                "slurm": ["partition", "account", "qos", "exclusive", "throttle", "time_margin", "max_time",
                          "sbatch_args", "python", "poll_interval", "grace", "runtime"]}
    cases, accepted = 0, []
    for section, keys in sections.items():
        for key in keys:
            for value in values:
                cases += 1
                text = f"[{section}]\n{key} = {value}\n"
                if section == "fixed" and key != "dataset":
                    text += 'dataset = "synthetic"\n'
                try:
                    load_matrix(write(tmp_path, text))
                except MatrixError as err:
                    first = str(err).splitlines()[0]
                    assert first.startswith(f"matrix.toml: [{section} -> {key}"), (text[:80], first)
                    assert err.exit_code == 2
                else:
                    accepted.append((key, value))
    assert cases == 10 * (len(PARAMS) + 8 + 12)
    assert accepted == [("lr", "18446744073709551616"), ("weight_decay", "18446744073709551616")]


def test_a_flood_of_errors_is_cut_at_fifty_lines(tmp_path: Path) -> None:
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, "[axes]\nthreads = [" + ", ".join(['"many"'] * 1000) + "]\n"))
    lines = str(err.value).splitlines()
    assert len(lines) == 51
    assert lines[0] == 'matrix.toml: [axes -> threads -> 0] expected a thread count from 1 to 1024 or "unset", got "many"'
    assert lines[-1] == "matrix.toml: … and 951 more problems"  # 1000 values + "lists the same value twice"


# -- the patterns ---------------------------------------------------------------------------


def test_every_validating_pattern_is_anchored_at_the_true_end() -> None:
    """`$` also matches before a final newline ("demo\\n"); a pattern that validates a value ends
    in `\\Z`.  Two patterns parse text line by line rather than validate a value, and keep `$`."""
    root = Path(__file__).resolve().parents[1]
    parsing = {("runner/environments/builds.py", "_STEP"), ("runner/environments/contexts.py", "_BASE_ARG")}
    found = []
    for folder in ("runner", "warehouse", "reports", "src"):
        for path in sorted((root / folder).rglob("*.py")):
            for name, pattern in re.findall(r'^(\w+) = re\.compile\(r"(.*?)"', path.read_text(encoding="utf-8"), re.M):
                if pattern.endswith("$"):
                    found.append((str(path.relative_to(root)), name))
    assert set(found) == parsing, found


def test_names_with_a_trailing_newline_are_refused_by_each_pattern() -> None:
    from matrun.runner.harness.cpusets import parse_cpuset
    from matrun.runner.slurm.settings import check_name, check_sbatch_arg, check_setting
    from matrun.warehouse.bundles.layout import parse_run_dir_name

    assert parse_run_dir_name("0-1") == (0, 1) and parse_run_dir_name("0-1\n") is None
    for refuse in (lambda: parse_cpuset("0-1\n"), lambda: check_name("debug\n", what="partition"),
                   lambda: check_sbatch_arg("--contiguous\n"), lambda: check_sbatch_arg("--comment=x\n"),
                   lambda: check_setting("python", "/usr/bin/python3\n")):
        with pytest.raises(ValueError):
            refuse()
    for key, value in [("variant", "cpu\n"), ("cpuset", "0\n")]:
        with pytest.raises(ValueError):
            PARAMS[key].check(value)
    assert PARAMS["cpuset"].check("0-9999") == "0-9999"
    assert math.isclose(PARAMS["timeout"].check(30 * 86_400), 2_592_000.0)
