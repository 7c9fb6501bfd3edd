"""Reading a bundle's step records and monitor samples in bulk (``warehouse/bundles/read.py``).

The bulk reading must be invisible: every bundle gives the same tables, digest and warnings,
and every damaged one the same refusal (file, line, key, words), whether its lines are read
in bulk or one at a time (the exact reader, the reference here), and in whatever blocks the
file is cut.  ``read._BULK_MIN_BYTES`` (0: every block in bulk; huge: none) and
``read.BLOCK_BYTES`` choose the way.  Speed and memory are measured by
``benchmarks/ingest_speed.py`` and ``benchmarks/bundle_memory.py``, not here.

Bundles come from bundle_factory, most with STEPS steps (events.jsonl: line 1 header, 2 probe,
3 data, 4 model, 5 on the steps, then 2 epochs, the summary and the end).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

import matrun.warehouse.bundles.read as read_module
from bundle_factory import make_bundle
from matrun.warehouse.bundles.read import (
    SAMPLE_COLUMNS, STEP_COLUMNS, BadBundle, Bundle, bundle_signature, load_bundle,
)
from matrun.warehouse.rows import SAMPLES_SCHEMA, STEPS_SCHEMA, Unstorable, bundle_tables
from test_hostile_inputs import ACCEPTED, HOSTILE_BUNDLES, hostile_bundle, matches

STEPS = 300
_RNG = random.Random(5)
SECONDS = [round(0.01 + 0.04 * _RNG.random(), 9) for _ in range(STEPS)]
INT32 = "(-2,147,483,648 to 2,147,483,647)"
FINITE = 'it must be a finite number (docs/BUNDLE.md "Validation")'
EVERY_BLOCK_IN_BULK = {"_BULK_MIN_BYTES": 0}
LINE_BY_LINE = {"_BULK_MIN_BYTES": 10**12}
TINY_BLOCKS = {"_BULK_MIN_BYTES": 0, "BLOCK_BYTES": 333}  # shorter than a probe line


def read_as(monkeypatch: pytest.MonkeyPatch, directory: Path, way: dict[str, int]) -> Any:
    """What reading ``directory`` gives when read this way: (digest, warnings, every table as
    Python rows), or the refusal's text."""
    with monkeypatch.context() as patch:
        for name, value in way.items():
            patch.setattr(read_module, name, value)
        try:
            bundle = load_bundle(directory)
        except BadBundle as exc:
            return f"BadBundle: {exc.short()}"
        try:
            tables = bundle_tables(bundle)
        except Unstorable as exc:
            return f"Unstorable: {exc}"
    return bundle.digest, bundle.warnings, {name: t.to_pylist() for name, t in tables.items()}


def same_every_way(monkeypatch: pytest.MonkeyPatch, directory: Path) -> Any:
    """What reading ``directory`` gives, checked to be the same in bulk, line by line and in
    tiny blocks."""
    exact = read_as(monkeypatch, directory, LINE_BY_LINE)
    for way in (EVERY_BLOCK_IN_BULK, TINY_BLOCKS):
        assert repr(read_as(monkeypatch, directory, way)) == repr(exact), way  # repr: -0.0 is not 0.0
    return exact


def step_line(n: int, seconds: str = "0.02", **raw: str) -> str:
    """Step ``n`` as the harness writes it, with values given as JSON text."""
    values = {"epoch": "0", "step": str(n), "phase": '"timed"', "seconds": seconds, "images": "64", **raw}
    return '{"type": "step", ' + ", ".join(f'"{key}": {text}' for key, text in values.items()) + "}"


def edit_lines(path: Path, change: Callable[[list[str]], None]) -> None:
    """Change a JSON-lines file's lines (a list without their newlines) in place."""
    lines = path.read_bytes().decode("utf-8", "surrogateescape").split("\n")
    change(lines)
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape"))


def set_step(directory: Path, index: int, line: str) -> None:
    edit_lines(directory / "events.jsonl", lambda lines: lines.__setitem__(4 + index, line))


def big_bundle(results: Path, cell_id: str = "c0ffee0000000001", **kwargs: Any) -> Path:
    kwargs.setdefault("step_seconds", SECONDS)
    kwargs.setdefault("monitor", [(0.2 * k, 90.0 + k % 3, 10.5, 0.25, 10**8 + k) for k in range(1, 201)])
    return make_bundle(results, cell_id=cell_id, **kwargs)


# -- the same tables -----------------------------------------------------------------------


def test_bulk_reading_gives_the_rows_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps and samples of a bundle as its writers wrote it, compared with the file read
    by json.loads; only its few other lines are parsed one at a time."""
    directory = big_bundle(tmp_path)
    events = (directory / "events.jsonl").read_text().splitlines()
    samples = (directory / "monitor.jsonl").read_text().splitlines()[1:]
    parsed: list[int] = []
    real_record = read_module._JsonLines.record
    monkeypatch.setattr(read_module._JsonLines, "record",
                        lambda self, number, line, *, cut: parsed.append(number) or real_record(
                            self, number, line, cut=cut))
    monkeypatch.setattr(read_module, "_BULK_MIN_BYTES", 0)
    tables = bundle_tables(load_bundle(directory))
    run_id = "c0ffee0000000001/0-1"
    assert tables["steps"].to_pylist() == [
        {"run_id": run_id, **{k: v for k, v in json.loads(line).items() if k != "type"}}
        for line in events if '"type": "step"' in line]
    assert tables["monitor_samples"].to_pylist() == [{"run_id": run_id, **json.loads(s)} for s in samples]
    assert tables["steps"].num_rows == STEPS and tables["monitor_samples"].num_rows == 200
    assert parsed == [1, 2, 3, 4, 305, 306, 307, 308, 1]  # events: header, probe, data, model,
    # two epochs, summary, end; monitor: its header


# name: how to change a bundle of STEPS steps (written by big_bundle) that either way reads
VARIANTS: dict[str, Callable[[Path], None]] = {
    "as written": lambda d: None,
    "CRLF line ends": lambda d: [(d / n).write_bytes((d / n).read_bytes().replace(b"\n", b"\r\n"))
                                 for n in ("events.jsonl", "monitor.jsonl")],
    "number texts": lambda d: [set_step(d, i, step_line(i, text)) for i, text in enumerate(
        ["-0", "-0.0", "0", "1E5", "1e+5", "2.5e-07", "1e-400", "-1e-400", "123456789012345",
         "-123456789012345", "1234567890123456", "0.1000000000000000055511151231257827",
         "4.9e-324", "1.7976931348623157e308", "12", "5e-05"])],
    "integers at their columns' limits": lambda d: [
        set_step(d, 7, step_line(7, epoch="2147483647", images="-2147483648")),
        set_step(d, 8, step_line(8, epoch="-0", images="0"))],
    "an epoch of null": lambda d: set_step(d, 9, step_line(9, epoch="null")),
    "step lines written otherwise": lambda d: [
        set_step(d, 0, '{"type":"step","epoch":0,"step":0,"phase":"warmup","seconds":0.02,"images":64}'),
        set_step(d, 150, '{"images": 64, "seconds": 0.5, "phase": "timed", "step": 150, "epoch": 0, "type": "step"}'),
        set_step(d, 151, step_line(151)[:-1] + ', "note": "extra"}'),
        set_step(d, 152, step_line(152)[:-1] + ', "images": 32}'),  # a key twice: the last counts
        set_step(d, STEPS - 1, step_line(STEPS - 1) + "  ")],
    "unknown records among the steps": lambda d: edit_lines(d / "events.jsonl", lambda lines: [
        lines.insert(100, '{"type": "note", "text": "between steps"}'),
        lines.insert(200, '{"type": "checkpoint", "path": "/x", "bytes": 12}')]),
    "no steps": lambda d: edit_lines(d / "events.jsonl", lambda lines: lines.__delitem__(slice(4, 4 + STEPS))),
    "monitor samples of the cgroup monitor": lambda d: edit_lines(d / "monitor.jsonl", lambda lines: [
        lines.__setitem__(n, lines[n][:-1] + f', "mem_usage_bytes": {n * 4096}}}') for n in range(1, 201)]),
    "monitor samples written otherwise": lambda d: edit_lines(d / "monitor.jsonl", lambda lines: [
        lines.__setitem__(50, lines[50].replace('"cpu_user": 90.0', '"cpu_user": null')),
        lines.__setitem__(51, lines[51].replace('"iowait": 0.25', '"iowait": 1')),
        lines.__setitem__(52, '{"t": 1.5}')]),
    "last line without a newline": lambda d: (d / "events.jsonl").write_bytes(
        (d / "events.jsonl").read_bytes().rstrip(b"\n")),
    "truncated mid-step (a failed run)": lambda d: (d / "events.jsonl").write_bytes(
        b"\n".join((d / "events.jsonl").read_bytes().split(b"\n")[:200]) + b'\n{"type": "step", "ep'),
    "truncated mid-sample (a failed run)": lambda d: (d / "monitor.jsonl").write_bytes(
        (d / "monitor.jsonl").read_bytes()[:-9]),
    "truncated mid-step on the last byte of UTF-8 (a failed run)": lambda d: (d / "events.jsonl").write_bytes(
        b"\n".join((d / "events.jsonl").read_bytes().split(b"\n")[:150]) + b'\n{"type": "note", "t": "\xc3'),
    "ends on a step, no summary (a failed run)": lambda d: (d / "events.jsonl").write_bytes(
        b"\n".join((d / "events.jsonl").read_bytes().split(b"\n")[:250]) + b"\n"),
    "no monitor": lambda d: (d / "monitor.jsonl").unlink(),
}
FAILED = {name for name in VARIANTS if "(a failed run)" in name}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bulk_and_exact_reading_give_the_same_tables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    directory = big_bundle(tmp_path, status="failed" if variant in FAILED else "ok")
    VARIANTS[variant](directory)
    result = same_every_way(monkeypatch, directory)
    assert not isinstance(result, str), result  # every variant is read
    digest, warnings, tables = result
    steps = [row["step"] for row in tables["steps"]]
    assert steps == sorted(steps)  # the rows keep the file's order
    if variant == "number texts":
        seconds = [row["seconds"] for row in tables["steps"][:16]]
        assert [struct.pack(">d", s) for s in seconds] == [struct.pack(">d", float(json.loads(t))) for t in [
            "-0", "-0.0", "0", "1E5", "1e+5", "2.5e-07", "1e-400", "-1e-400", "123456789012345",
            "-123456789012345", "1234567890123456", "0.1000000000000000055511151231257827",
            "4.9e-324", "1.7976931348623157e308", "12", "5e-05"]]  # -0 an integer: +0.0
    if variant.startswith("truncated"):
        assert len(warnings) == 1 and warnings[0].split(": ")[1].startswith("ignored truncated line")


def test_the_numbers_of_the_bulk_reading_are_pythons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step times as any double's shortest text, and decimal texts of up to 40 digits at every
    exponent: the bulk reading gives bit for bit what ``float()`` gives."""
    rng = random.Random(13)
    texts = []
    while len(texts) < 4000:
        value = struct.unpack(">d", rng.getrandbits(64).to_bytes(8, "big"))[0]
        if value == value and abs(value) != float("inf"):
            texts.append(repr(value))
    for _ in range(4000):
        digits = str(rng.randrange(1, 10 ** rng.randint(1, 40)))
        texts.append(f"{digits[0]}.{digits[1:] or '0'}e{rng.randint(-330, 300)}")
        texts.append(f"0.{digits}")
    directory = big_bundle(tmp_path, step_seconds=[0.5] * len(texts))
    edit_lines(directory / "events.jsonl", lambda lines: lines.__setitem__(
        slice(4, 4 + len(texts)), [step_line(n, text) for n, text in enumerate(texts)]))
    digest, warnings, tables = same_every_way(monkeypatch, directory)
    assert [struct.pack(">d", row["seconds"]) for row in tables["steps"]] == [
        struct.pack(">d", float(text)) for text in texts]


# -- the same refusals ---------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(HOSTILE_BUNDLES))
def test_each_hostile_bundle_is_refused_alike_in_bulk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """test_hostile_inputs' bundles, every block read in bulk: the same reason."""
    directory = hostile_bundle(tmp_path / "results", case)
    for way in (EVERY_BLOCK_IN_BULK, TINY_BLOCKS):
        reason = read_as(monkeypatch, directory, way)
        assert reason.startswith("BadBundle: ") and matches(reason[len("BadBundle: "):],
                                                            HOSTILE_BUNDLES[case][1]), reason


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_each_accepted_damage_reads_alike_in_bulk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  case: str) -> None:
    directory = make_bundle(tmp_path / "results")
    ACCEPTED[case](directory)
    assert not isinstance(same_every_way(monkeypatch, directory), str)


# name: (the line that replaces step 150 (line 155), in the middle of a bulk block, or a change
# of the whole bundle; the reason, the same either way)
FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "images 2^31": (
        lambda d: set_step(d, 150, step_line(150, images=str(2**31))),
        f"BadBundle: events.jsonl: line 155: step record key 'images' is 2147483648, outside the "
        f"range of its warehouse column {INT32}"),
    "step of 11 digits": (
        lambda d: set_step(d, 150, step_line(150, step="99999999999")),
        f"BadBundle: events.jsonl: line 155: step record key 'step' is 99999999999, outside the "
        f"range of its warehouse column {INT32}"),
    "epoch below INTEGER": (
        lambda d: set_step(d, 150, step_line(150, epoch=str(-(2**31) - 1))),
        f"BadBundle: events.jsonl: line 155: step record key 'epoch' is -2147483649, outside the "
        f"range of its warehouse column {INT32}"),
    "seconds 1e400": (
        lambda d: set_step(d, 150, step_line(150, "1e400")),
        f"BadBundle: events.jsonl: line 155: step record key 'seconds' is 1e400: {FINITE}"),
    "seconds NaN": (
        lambda d: set_step(d, 150, step_line(150, "NaN")),
        f"BadBundle: events.jsonl: line 155: step record key 'seconds' is NaN: {FINITE}"),
    "seconds as text": (
        lambda d: set_step(d, 150, step_line(150, '"fast"')),
        "BadBundle: events.jsonl: line 155: step record key 'seconds' should be a number, got \"fast\""),
    "images true": (
        lambda d: set_step(d, 150, step_line(150, images="true")),
        "BadBundle: events.jsonl: line 155: step record key 'images' should be an integer, got true"),
    "phase cooldown": (
        lambda d: set_step(d, 150, step_line(150, phase='"cooldown"')),
        "BadBundle: events.jsonl: line 155: step phase 'cooldown' is not 'warmup', 'timed' or 'sampled'"),
    "a lone surrogate in an extra key": (
        lambda d: set_step(d, 150, step_line(150)[:-1] + ', "x": "\\ud800"}'),
        "BadBundle: events.jsonl: line 155: step record key 'x' holds a lone UTF-16 surrogate "
        "(\\ud800-\\udfff): not text"),
    "a step that is not UTF-8": (
        lambda d: set_step(d, 150, step_line(150).replace("timed", "t\udcffmed")),
        "BadBundle: events.jsonl: invalid JSON at line 155: not UTF-8"),
    "an empty line": (
        lambda d: set_step(d, 150, ""),
        "BadBundle: events.jsonl: invalid JSON at line 155: Expecting value"),
    "a leading zero": (
        lambda d: set_step(d, 150, step_line(150, images="064")),
        "BadBundle: events.jsonl: invalid JSON at line 155: Expecting ',' delimiter"),
    "an array for a line": (
        lambda d: set_step(d, 150, "[1, 2]"),
        "BadBundle: events.jsonl: line 155 is not a JSON object"),
    "the first of two faults": (  # a step fault (bulk) before a record's fault (exact): the step's
        lambda d: [set_step(d, 150, step_line(150, images=str(2**31))),
                   edit_lines(d / "events.jsonl", lambda lines: lines.__setitem__(1, lines[1][:-1] + ', "x": NaN}'))],
        f"BadBundle: events.jsonl: line 2: probe record key 'x' is NaN: {FINITE}"),
    "the first of two faults, reversed": (
        lambda d: [set_step(d, 150, step_line(150, images=str(2**31))),
                   edit_lines(d / "events.jsonl", lambda lines: lines.__setitem__(
                       4 + STEPS, lines[4 + STEPS][:-1] + ', "x": NaN}'))],
        f"BadBundle: events.jsonl: line 155: step record key 'images' is 2147483648, outside the "
        f"range of its warehouse column {INT32}"),
    "a record's fault before a line that does not parse": (
        lambda d: edit_lines(d / "events.jsonl", lambda lines: [
            lines.__setitem__(1, lines[1][:-1] + ', "x": NaN}'), lines.__setitem__(199, '{"type": ')]),
        f"BadBundle: events.jsonl: line 2: probe record key 'x' is NaN: {FINITE}"),
    "an ok run cut off mid-step": (
        lambda d: (d / "events.jsonl").write_bytes(
            b"\n".join((d / "events.jsonl").read_bytes().split(b"\n")[:200]) + b'\n{"type": "st'),
        "BadBundle: events.jsonl: line 201 is truncated (the file ends mid-record) but result.json "
        "says status ok"),
    "step on line 1": (
        lambda d: edit_lines(d / "events.jsonl", lambda lines: lines.__delitem__(slice(0, 4))),
        "BadBundle: events.jsonl: line 1 is not a header record"),
    "sample rss 2^63": (
        lambda d: edit_lines(d / "monitor.jsonl", lambda lines: lines.__setitem__(
            120, lines[120].replace('"rss_bytes": 100000120', f'"rss_bytes": {2**63}'))),
        "BadBundle: monitor.jsonl: line 121: sample key 'rss_bytes' is 9223372036854775808, outside "
        "the range of its warehouse column (-9,223,372,036,854,775,808 to 9,223,372,036,854,775,807)"),
    "sample nprocs 2^31": (
        lambda d: edit_lines(d / "monitor.jsonl", lambda lines: lines.__setitem__(
            120, lines[120].replace('"nprocs": 1', f'"nprocs": {2**31}'))),
        f"BadBundle: monitor.jsonl: line 121: sample key 'nprocs' is 2147483648, outside the range "
        f"of its warehouse column {INT32}"),
    "sample t Infinity": (
        lambda d: edit_lines(d / "monitor.jsonl", lambda lines: lines.__setitem__(
            120, lines[120].replace('"t": ', '"t": Infinity, "was": '))),
        f"BadBundle: monitor.jsonl: line 121: sample key 't' is Infinity: {FINITE}"),
    # read, but no warehouse column can hold it: rows names the value
    "seconds an integer beyond 2^53": (
        lambda d: set_step(d, 150, step_line(150, "9007199254740993")),
        "Unstorable: steps.seconds: 9007199254740993 does not fit its type double (ArrowInvalid)"),
    "sample t an integer beyond 2^53": (
        lambda d: edit_lines(d / "monitor.jsonl", lambda lines: lines.__setitem__(
            120, lines[120].replace('"t": 24.0', f'"t": {2**60 + 1}'))),
        f"Unstorable: monitor_samples.t: {2**60 + 1} does not fit its type double (ArrowInvalid)"),
}


@pytest.mark.parametrize("case", sorted(FAULTS))
def test_a_fault_amid_bulk_lines_is_reported_as_the_exact_reader_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    damage, reason = FAULTS[case]
    directory = big_bundle(tmp_path)
    damage(directory)
    for way in (LINE_BY_LINE, EVERY_BLOCK_IN_BULK, TINY_BLOCKS):
        assert read_as(monkeypatch, directory, way) == reason, way


# -- the digest and the signature ------------------------------------------------------------


def test_the_digest_is_the_documented_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sha256 over spec, events, monitor, result, each after "<name>\\0<length>\\0" (absent:
    empty), computed here from the files whole; the reader hashes them block by block."""
    def documented(directory: Path) -> str:
        h = hashlib.sha256()
        for name in ("spec.json", "events.jsonl", "monitor.jsonl", "result.json"):
            data = (directory / name).read_bytes() if (directory / name).exists() else b""
            h.update(f"{name}\0{len(data)}\0".encode() + data)
        return h.hexdigest()

    directory = big_bundle(tmp_path)
    for way in (LINE_BY_LINE, EVERY_BLOCK_IN_BULK, TINY_BLOCKS):
        assert read_as(monkeypatch, directory, way)[0] == documented(directory)
    (directory / "monitor.jsonl").unlink()
    assert read_as(monkeypatch, directory, TINY_BLOCKS)[0] == documented(directory)


def test_a_file_that_shrinks_while_it_is_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = big_bundle(tmp_path)
    events = directory / "events.jsonl"
    size = events.stat().st_size
    real_open = read_module._open

    def open_then_truncate(path: Path, stack: Any) -> Any:
        opened = real_open(path, stack)
        if path.name == "events.jsonl":
            os.truncate(path, 1000)
        return opened

    monkeypatch.setattr(read_module, "_open", open_then_truncate)
    with pytest.raises(BadBundle) as err:
        load_bundle(directory)
    assert err.value.short() == (f"events.jsonl: became shorter while it was read ({size} bytes, "
                                 "then 1000): read it again")


def test_bundle_signature_changes_with_any_file(tmp_path: Path) -> None:
    directory = big_bundle(tmp_path)
    first = bundle_signature(directory)
    assert bundle_signature(directory) == first == load_bundle(directory).signature
    parts = first.split(";")
    assert [p.split(":")[0] for p in parts] == ["spec.json", "events.jsonl", "monitor.jsonl", "result.json"]
    info = os.lstat(directory / "events.jsonl")
    assert parts[1] == f"events.jsonl:{info.st_size}:{info.st_mtime_ns}:{info.st_ino}:{info.st_ctime_ns}"

    os.utime(directory / "monitor.jsonl", ns=(1, 2))  # touched: same bytes, another mtime
    touched = bundle_signature(directory)
    assert [a == b for a, b in zip(touched.split(";"), parts)] == [True, True, False, True]
    (directory / "monitor.jsonl").unlink()
    assert bundle_signature(directory).split(";")[2] == "monitor.jsonl:absent"


def test_a_bundles_signature_is_taken_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that changes while the bundle is read leaves the signature of before, so the
    next ingest, which finds another signature, reads the bundle again."""
    directory = big_bundle(tmp_path)
    before = bundle_signature(directory)
    real_open = read_module._open

    def open_then_touch(path: Path, stack: Any) -> Any:
        if path.name == "result.json":
            os.utime(directory / "events.jsonl", ns=(5, 6))
        return real_open(path, stack)

    monkeypatch.setattr(read_module, "_open", open_then_touch)
    bundle: Bundle = load_bundle(directory)
    assert bundle.signature == before != bundle_signature(directory)


def test_the_bulk_columns_are_the_warehouse_columns() -> None:
    """The reader's batches have the warehouse tables' types, so their tables reuse them."""
    for columns, schema in ((STEP_COLUMNS, STEPS_SCHEMA), (SAMPLE_COLUMNS, SAMPLES_SCHEMA)):
        assert columns == pa.schema([f for f in schema if f.name != "run_id"])
